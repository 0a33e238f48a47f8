"""The cache bulk row: a bulk job with repeated rows, result cache on versus off.

``rows`` demo-encoder rows, half of them repeats of earlier rows placed at least
one batch (and one bulk window) later, so a repeat is never in the same batch as
its original. The same job runs twice through ``batchfleet bulk run`` against a
fresh worker: once with ``--cache-ttl-s`` and once without; rows/s and the wall
time of each are reported, with the hit ratio the cached worker's heartbeat counts
and whether both runs wrote the same outputs. When the worker has no
``--cache-ttl-s`` yet the row records why and is skipped.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.plan import CachePlan
from batchfleet.bench.sweep import worker_option_missing
from batchfleet.connectors import open_control_plane
from batchfleet.demo import demo_inputs

_WINDOW = 512
_TIMEOUT_S = 1800.0
#: Long enough for a few heartbeats to carry the last batches' cache counters.
_COUNTERS_WAIT_S = 15.0


def repeated_rows(rows: int, min_gap: int, seed: int) -> np.ndarray[Any, Any]:
    """``rows`` encoder rows: the first half distinct, the second half repeats of rows at
    least ``min_gap`` positions earlier, interleaved so repeats run through the job."""
    half = rows // 2
    fresh = demo_inputs("demo-encoder", rows - half, seed)
    out = np.empty((rows, *fresh.shape[1:]), dtype=fresh.dtype)
    out[0::2][: len(fresh)] = fresh
    rng = np.random.default_rng(seed)
    for pos in range(1, rows, 2):
        # Fresh rows sit at even positions; pick one at least ``min_gap`` earlier.
        latest = (pos - min_gap) // 2
        out[pos] = fresh[rng.integers(0, latest + 1)] if latest >= 0 else fresh[0]
    return out


def _bulk(svc: fleet.Services, namespace: str, src: Path, dst: Path) -> dict[str, Any]:
    args = [sys.executable, "-m", "batchfleet", "bulk", "run", "-m", "demo-encoder",
            "-i", str(src), "-o", str(dst), "--broker", svc.redis_url,
            "--results", svc.redis_url, "--namespace", namespace,
            "--window", str(_WINDOW), "--progress", "none", "--json"]
    began = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=_TIMEOUT_S,
                          check=False)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(f"bulk run exited {proc.returncode}: {proc.stderr[-800:]}")
    try:
        record = json.loads(proc.stdout)
    except json.JSONDecodeError:
        record = {}
    return {"wall_s": round(wall, 2), "record": record}


async def _cache_counters(redis_url: str, namespace: str, expected: int) -> dict[str, int]:
    """The live workers' summed cache counters, once they account for ``expected``
    requests (heartbeats trail the last batch by up to one beat) or the wait ends."""
    plane = open_control_plane(redis_url, namespace=namespace)
    keys = ("cache_hits", "cache_coalesced", "cache_misses", "cache_errors")
    totals = dict.fromkeys(keys, 0)
    try:
        beats = plane.heartbeats
        deadline = time.monotonic() + _COUNTERS_WAIT_S
        while True:
            records = await beats.read_all()
            totals = {k: sum(r.counters.get(k, 0) for r in records) for k in keys}
            if sum(totals[k] for k in keys[:3]) >= expected or time.monotonic() > deadline:
                return totals
            await asyncio.sleep(0.5)
    finally:
        await plane.close()


def _differing_rows(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int | None:
    """Rows whose outputs are not bit-for-bit equal; None when the shapes differ."""
    if a.shape != b.shape:
        return None
    if a.ndim == 1:
        return int(np.count_nonzero(a != b))
    return int(np.count_nonzero(np.any(a != b, axis=tuple(range(1, a.ndim)))))


def _hit_ratio(counters: dict[str, int]) -> float | None:
    hits = counters["cache_hits"] + counters["cache_coalesced"]
    seen = hits + counters["cache_misses"]
    return round(hits / seen, 4) if seen else None


def run_cache_row(svc: fleet.Services, plan: CachePlan, seed: int) -> dict[str, Any]:
    row: dict[str, Any] = {"rows": plan.rows, "repeats": plan.rows // 2,
                           "cache_ttl_s": plan.cache_ttl_s, "max_batch_size": plan.max_batch_size}
    missing = worker_option_missing("cache_ttl_s", "--cache-ttl-s")
    if missing is not None:
        return {**row, "skipped": missing}
    data = repeated_rows(plan.rows, max(plan.max_batch_size, _WINDOW), seed)
    runs: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
            src = Path(tmp) / "rows.npy"
            np.save(src, data)
            for label, extra in (("cache_off", ()),
                                 ("cache_on", ("--cache-ttl-s", f"{plan.cache_ttl_s:g}"))):
                namespace = fleet.new_namespace(f"cache-{label}")
                with fleet.worker(svc, "redis", "demo-encoder", plan.max_batch_size, 5.0,
                                  namespace, extra):
                    got = _bulk(svc, namespace, src, Path(tmp) / f"{label}.npy")
                    if extra:
                        got["counters"] = asyncio.run(
                            _cache_counters(svc.redis_url, namespace, plan.rows))
                runs[label] = {**got, "rows_per_s": round(plan.rows / got["wall_s"], 1)}
            off_out = np.load(Path(tmp) / "cache_off.npy")
            on_out = np.load(Path(tmp) / "cache_on.npy")
    except Exception as exc:  # the option may exist but not work yet: note it, go on
        return {**row, **runs, "skipped": f"{type(exc).__name__}: {exc}"[:500]}
    off, on = runs["cache_off"]["rows_per_s"], runs["cache_on"]["rows_per_s"]
    same_shape = off_out.shape == on_out.shape
    return {**row, **runs, "speedup": round(on / off, 3) if off else None,
            "hit_ratio": _hit_ratio(runs["cache_on"]["counters"]),
            "identical_outputs": bool(same_shape and np.array_equal(off_out, on_out)),
            "differing_rows": _differing_rows(off_out, on_out),
            "max_abs_diff": float(np.max(np.abs(off_out - on_out)))
            if same_shape and off_out.size else None}
