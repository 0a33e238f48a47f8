"""The markdown tables printed by ``batchfleet bench`` and written next to its JSON.

One function per table, each taking the JSON-shaped report, so the same text
can be regenerated from a saved ``bench.json`` without re-running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from batchfleet.bench.targets import evaluate

#: More than this many cores used by other processes in a window earns a warning.
BUSY_OTHER_CORES = 0.2


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:,.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |"
              for row in rows]
    return "\n".join(lines)


def targets_table(report: dict[str, Any]) -> str:
    rows = [(t.name, _fmt(t.value, 2), f"{'>=' if t.sense == 'min' else '<='} {t.goal:g}",
             "met" if t.met else f"**missed** ({t.miss.removeprefix('missed by ')})", t.detail)
            for t in evaluate(report)]
    return table(("target", "value", "goal", "result", "detail"), rows)


def _util(cpu: dict[str, float]) -> str:
    order = ("worker", "client", "redis", "kafka", "other")
    return " / ".join(f"{cpu[k]:.2f}" if k in cpu else "-" for k in order)


def _threads(split: dict[str, float]) -> str:
    keys = ("loop_busy_frac", "loop_wait_frac", "compute_threads_frac")
    return " / ".join(f"{split[k]:.2f}" for k in keys) if split else "-"


def throughput_table(report: dict[str, Any]) -> str:
    ceilings = report.get("ceilings", {})
    rows = []
    for s in report.get("scenarios", []):
        t = s["throughput"]
        ceiling = ceilings.get(s["model"], {}).get("forward", {}).get("samples_per_s")
        split = t["time_split"]
        workers = s.get("workers", 1)
        rows.append((
            s["model"] + (f" ({workers} workers)" if workers > 1 else ""), s["transport"],
            f"{s['max_batch_size']} / {s['max_wait_ms']:g}",
            _fmt(t["throughput_rps"]), _fmt(ceiling),
            _fmt(t["throughput_rps"] / ceiling, 3) if ceiling else "-",
            _fmt(t["mean_batch_size"]), _fmt(split.get("mean_queue_ms"), 2),
            _fmt(split.get("mean_compute_ms"), 2), _fmt(split.get("mean_rest_ms"), 2),
            _fmt(t["worker_cpu_us_per_request"]),
            _fmt(t["worker_overhead_us_per_request"]["as_specified"]),
            _fmt(t.get("client_cpu_us_per_request")),
            _util(t.get("cpu_util", {})),
            _threads(t.get("worker_threads", {})),
        ))
    return table(("model", "transport", "batch / wait ms", "req/s", "ceiling req/s",
                  "e2e / ceiling", "mean batch", "queue ms", "compute ms", "rest ms",
                  "worker CPU us/req", "overhead us/req", "client CPU us/req",
                  "CPU cores: worker / client / redis / kafka / other",
                  "worker loop busy / loop waiting / other threads (cores)"), rows)


def latency_table(report: dict[str, Any]) -> str:
    rows = []
    for s in report.get("scenarios", []):
        points = [*s["latency"], *([s["latency_coalesced"]] if "latency_coalesced" in s else [])]
        for p in points:
            lat, fleet = p["latency"], p.get("latency_fleet", {})
            style = "submit_many" if p["submit_mode"] == "coalesced" else "submit()"
            rows.append((s["model"], s["transport"], f"{p['load']:.0%} {style}",
                         _fmt(p["offered_rps"]), _fmt(p["achieved_rps"]),
                         _fmt(lat["p50_ms"], 2), _fmt(lat["p95_ms"], 2), _fmt(lat["p99_ms"], 2),
                         _fmt(fleet.get("p50_ms"), 2), _fmt(fleet.get("p95_ms"), 2),
                         _fmt(fleet.get("p99_ms"), 2), _fmt(p["mean_batch_size"]),
                         _fmt(p.get("client_cpu_us_per_request")),
                         _fmt(p["submit_ms"]["p50"], 2), _fmt(p["start_lag_ms"]["p99"], 2)))
    out = table(("model", "transport", "load / submit style", "offered req/s",
                 "achieved req/s", "caller p50 ms", "caller p95 ms", "caller p99 ms",
                 "fleet p50 ms", "fleet p95 ms", "fleet p99 ms", "mean batch",
                 "client CPU us/req", "submit p50 ms", "client lag p99 ms"), rows)
    if any(s.get("fresh_log_per_phase") for s in report.get("scenarios", [])):
        out += ("\n\nOver Kafka each open-loop row ran on fresh topics, with its own worker and "
                "producers: Tansu's in-memory fetch costs CPU in proportion to the batches "
                "already in a topic (docs/performance.md, \"Method\").")
    return out


def stages_table(report: dict[str, Any]) -> str:
    """After the worker's ``finished_at``: where the caller's time goes, per open-loop row."""
    rows = []
    for s in report.get("scenarios", []):
        points = [*s["latency"], *([s["latency_coalesced"]] if "latency_coalesced" in s else [])]
        for p in points:
            st = p.get("client_stages") or {}
            if not st:
                continue
            style = "submit_many" if p["submit_mode"] == "coalesced" else "submit()"

            def pair(name: str, st: dict[str, Any] = st) -> str:
                got = st.get(name)
                return f"{_fmt(got['p50'], 2)} / {_fmt(got['p99'], 2)}" if got else "-"

            rows.append((s["model"], s["transport"], f"{p['load']:.0%} {style}",
                         pair("announce_ms"), pair("deliver_ms"), pair("wake_ms"),
                         f"{st.get('announced_frac', 0.0):.1%}"))
    return table(("model", "transport", "load / submit style",
                  "finished_at -> announcement received, p50 / p99 ms",
                  "decode and hand over, p50 / p99 ms", "caller task wakes, p50 / p99 ms",
                  "announced"), rows)


def _ages(latency: dict[str, float] | None) -> str:
    if not latency:
        return ""
    return (f"message age p50 {_fmt(latency['p50'])} / p99 {_fmt(latency['p99'])} ms "
            f"({_fmt(latency['max'])} max); ")


def baselines_table(report: dict[str, Any]) -> str:
    rows = []
    for c in report.get("ceilings", {}).values():
        copies = c.get("copies")
        copy_note = ("" if not copies else
                     f"; H2D copy {_fmt(copies['pageable_ms'], 3)} ms pageable, "
                     f"{_fmt(copies['pinned_non_blocking_ms'], 3)} ms pinned; forward "
                     f"{_fmt(copies['forward_ms'], 3)} ms alone, "
                     f"{_fmt(copies['forward_with_copy_ms'], 3)} ms with a copy beside it")
        rows.append((f"model alone: {c['model']}", f"batch {c['batch_size']}, "
                     f"{c['torch_threads']} torch threads, {c.get('device', 'cpu')}",
                     _fmt(c["forward"]["samples_per_s"]),
                     f"handler path {_fmt(c['handler']['samples_per_s'])}/s; "
                     f"{_fmt(c['forward']['ms_per_batch'], 3)} ms/batch; "
                     f"CPU/wall {c['forward']['cpu_per_wall']:.2f}{copy_note}"))
    rq = report.get("naive_rq", {})
    fastest = rq.get("fastest", {})
    for r in [*rq.get("runs", []), *([rq["pool"]] if "pool" in rq else [])]:
        star = " (fastest)" if (r["worker_class"] == fastest.get("worker_class")
                                and r["workers"] == fastest.get("workers")) else ""
        rows.append((f"naive RQ: {r['worker_class'].rsplit('.', 1)[-1]}{star}",
                     f"{r['workers']} worker(s), {r['jobs']:,} jobs",
                     _fmt(r["jobs_per_s"]),
                     f"worker CPU {_fmt(r['worker_cpu_us_per_job'])} us/job"))
    for loop in report.get("broker_loop", {}).values():
        rows.append((f"broker-only loop: {loop['transport']}",
                     f"{loop['payload_bytes']} B payloads, batch {loop['batch_size']}, "
                     f"{loop['producers']} producer processes",
                     _fmt(loop["msgs_per_s"]),
                     f"no decode, no model; mean batch {_fmt(loop['mean_batch_size'])}; "
                     + _ages(loop.get("latency_ms")) +
                     f"consumer CPU {_fmt(loop['consumer_cpu_us_per_msg'], 2)} us/msg, "
                     f"producers {_fmt(loop['client_cpu_us_per_msg'], 2)} us/msg"))
    return table(("baseline", "setting", "req/s", "notes"), rows)


def slo_table(report: dict[str, Any]) -> str:
    slo = report.get("sweep_slo") or {}
    if slo.get("skipped"):
        return f"SLO row (--latency-slo-ms {slo['latency_slo_ms']:g}) skipped: {slo['skipped']}"
    best = slo.get("best_fixed") or {}
    head = (f"Worker with --latency-slo-ms {slo['latency_slo_ms']:g} (max_batch_size "
            f"{slo['max_batch_size']}, max_wait_ms {slo['max_wait_ms']:g}): saturation "
            f"{_fmt(slo['throughput_rps'])} req/s, {_fmt(slo.get('throughput_vs_best_fixed'), 2)}"
            f"x the best fixed setting ({best.get('max_batch_size')} / "
            f"{_fmt(best.get('max_wait_ms'), 0)} ms: {_fmt(best.get('throughput_rps'))} "
            "req/s); submit_many producers.\n\n")
    rows = [(f"{p['load']:.0%}", _fmt(p["offered_rps"]), _fmt(p["achieved_rps"]),
             _fmt(p["fleet_p50_ms"], 2), _fmt(p["fleet_p95_ms"], 2), _fmt(p["fleet_p99_ms"], 2),
             _fmt(p["caller_p99_ms"], 2), _fmt(p["mean_batch_size"]))
            for p in slo.get("points", [])]
    return head + table(("load", "offered req/s", "achieved req/s", "fleet p50 ms",
                         "fleet p95 ms", "fleet p99 ms", "caller p99 ms", "mean batch"), rows)


def cache_table(report: dict[str, Any]) -> str:
    c = report.get("cache_bulk") or {}
    if c.get("skipped"):
        return f"Cache bulk row skipped: {c['skipped']}"
    rows = [(label, _fmt(c[key]["wall_s"], 2), _fmt(c[key]["rows_per_s"]))
            for label, key in (("cache off", "cache_off"), ("cache on", "cache_on"))
            if key in c]
    return (f"{c['rows']:,} demo-encoder rows, {c['repeats']:,} repeats at least one batch "
            f"apart; speedup {_fmt(c.get('speedup'), 2)}x; hit ratio "
            f"{_fmt(c.get('hit_ratio'), 4)}; rows whose outputs differ: "
            f"{c.get('differing_rows', 'n/a')}.\n\n"
            + table(("bulk job", "wall s", "rows/s"), rows))


def stats_cost_table(report: dict[str, Any]) -> str:
    c = report.get("stats_cost") or {}
    if c.get("skipped"):
        return f"Output statistics cost row skipped: {c['skipped']}"
    rows = [(side, ", ".join(_fmt(x) for x in c[f"{side}_rps"]), _fmt(c[f"{side}_median_rps"]),
             ", ".join(_fmt(x) for x in c.get(f"{side}_worker_cpu_us", [])))
            for side in ("off", "on")]
    share = c.get("summary_share_of_worker_cpu")
    return (f"demo-mlp over {c['transport']}, closed loop, alternating off/on, "
            f"{c['rounds']} rounds; cost {c['cost']:.2%} of throughput (limit "
            f"{c['limit']:.0%}). The statistics' own CPU: "
            f"{_fmt(c.get('summary_us_per_request'), 3)} us per request"
            + (f", {share:.2%} of the worker's CPU per request" if share is not None else "")
            + ".\n\n" + table(("output statistics", "req/s per run", "median",
                                "worker CPU us/req per run"), rows))


def sweep_table(report: dict[str, Any]) -> str:
    rows = [(p["max_batch_size"], _fmt(p["max_wait_ms"], 0), _fmt(p["throughput_rps"]),
             f"{p['load']:.0%} {p.get('submit_mode', 'per-request')}",
             _fmt(p["offered_rps"]), _fmt(p["p50_ms"], 2), _fmt(p["p99_ms"], 2),
             _fmt(p.get("fleet_p99_ms"), 2), _fmt(p["mean_batch_size"]))
            for p in report.get("sweep", [])]
    return table(("max_batch_size", "max_wait_ms", "saturation req/s", "open-loop load",
                  "offered req/s", "caller p50 ms", "caller p99 ms", "fleet p99 ms",
                  "mean batch"), rows)


def profile_table(report: dict[str, Any], top: int = 10) -> str:
    parts = []
    for key, prof in report.get("profiles", {}).items():
        for who in ("worker", "client"):
            summary = prof.get(who)
            if not summary or not summary.get("samples"):
                continue
            roles = ", ".join(f"{r} {p:.0f}%" for r, p in summary["roles"].items())
            parts.append(f"**{key}, {who}** ({summary['samples']:,} samples; {roles})\n")
            parts.append(table(("function (self time)", "% of samples"),
                               [(e["function"], _fmt(e["pct"])) for e in summary["self"][:top]]))
            project = summary.get("project_inclusive", [])[:top]
            if project:
                parts.append(table(("batchfleet function (inclusive)", "% of samples"),
                                   [(e["function"], _fmt(e["pct"])) for e in project]))
    return "\n\n".join(parts)


def _phase_speeds(report: dict[str, Any]) -> str:
    """The host-speed probe read before each scenario (since 2026-11-30): the host's speed
    moves within a run, so a phase that ran slow is told from a slow change."""
    speeds = [(s["model"], s["transport"], s["host_speed_us_before"])
              for s in report.get("scenarios", []) if "host_speed_us_before" in s]
    if not speeds:
        return ""
    return ("\n\nHost speed probe before each scenario (us, lower is faster): "
            + "; ".join(f"{model} over {transport} {us:,.0f}" for model, transport, us in speeds)
            + ".\n")


def _host_line(meta: dict[str, Any]) -> str:
    """The host-speed probes and the stolen CPU (``bench.host_speed``): what two runs
    must agree on before their absolute figures are compared."""
    if "host_speed_us_start" not in meta:  # a report from before they were recorded
        return ""
    wakeup = ""
    start, end = meta.get("host_wakeup_us_start"), meta.get("host_wakeup_us_end")
    if isinstance(start, int | float) and isinstance(end, int | float):  # since 2026-11-29
        wakeup = (f" Wake-up probe: {start:,.1f} us at the start and {end:,.1f} us at the "
                  "end (a byte to a child process and back on the idle machine: what each "
                  "hop between the fleet's processes pays).")
    return (f" Host speed probe: {meta['host_speed_us_start']:,.0f} us at the start and "
            f"{meta.get('host_speed_us_end', 0.0):,.0f} us at the end (fixed single-threaded "
            "work on the idle machine; lower is faster, compare runs by it);" + wakeup +
            f" CPU stolen by the hypervisor during the run: {meta.get('steal_pct', 0.0):.1f}%.")


def render_markdown(report: dict[str, Any]) -> str:
    meta = report.get("meta", {})
    head = (f"# batchfleet bench{' (quick)' if meta.get('quick') else ''}\n\n"
            f"{meta.get('machine', '')}{_host_line(meta)}\n")
    other = meta.get("max_other_cores") or 0.0
    if other > BUSY_OTHER_CORES:
        head += (f"\n**Warning: the machine was busy.** Processes outside the bench used up "
                 f"to {other:.2f} cores during a measured window (load average "
                 f"{meta.get('loadavg_start')} at start); figures are depressed and ratios "
                 "against the ceiling are unreliable. Re-run on a quiet machine.\n")
    sections = [head, "## Targets\n", targets_table(report),
                "\n## Throughput (closed loop, saturated)\n", throughput_table(report)
                + _phase_speeds(report),
                "\n## Latency (open loop, Poisson; caller-side: scheduled arrival to result "
                "in the caller; fleet-side: enqueued_at to finished_at)\n",
                latency_table(report),
                "\n## After finished_at: where the caller's time goes (open loop)\n",
                stages_table(report), "\n## Baselines (same run, same machine)\n",
                baselines_table(report)]
    if report.get("flood"):
        from batchfleet.bench.flood import flood_table

        sections += ["\n## Isolation (demo-mlp under a bad demo-encoder flood)\n",
                     flood_table(report)]
    if report.get("sweep"):
        sections += ["\n## Sweep\n", sweep_table(report)]
    if report.get("sweep_slo"):
        sections += ["\n## Sweep: SLO row (fleet-side latency)\n", slo_table(report)]
    if report.get("cache_bulk"):
        sections += ["\n## Cache bulk row\n", cache_table(report)]
    if report.get("stats_cost"):
        sections += ["\n## Output statistics: cost\n", stats_cost_table(report)]
    if report.get("profiles"):
        sections += ["\n## Profile (py-spy, separate passes)\n", profile_table(report)]
    return "\n".join(sections) + "\n"
