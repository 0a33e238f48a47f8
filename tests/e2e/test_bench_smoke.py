"""``batchfleet bench`` end to end on a tiny run: it works and its JSON has the promised shape.

No timing thresholds: CI machines vary. This checks that every part runs (model-alone
ceiling, naive RQ, closed and open loops over Redis and Kafka, the sweep and its plot)
and that every number it reports is a positive, finite measurement.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from batchfleet.connectors.embedded_kafka import find_tansu
from batchfleet.schemas.errors import ConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _kafka_available() -> bool:
    try:
        find_tansu()
    except ConfigError:
        return False
    return True


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _run_bench(tmp_path: Path, transports: list[str]) -> dict[str, Any]:
    args = [sys.executable, "-m", "batchfleet", "bench", "--quick", "-m", "demo-mlp",
            "--out", str(tmp_path / "out"), "--plot", str(tmp_path / "sweep.png"),
            "--seconds", "1", "--max-requests", "300", "--rq-jobs", "60",
            "--rq-class", "rq.worker.SimpleWorker", "--sweep", "--sweep-batch", "32",
            "--sweep-wait", "5", "--json"]
    for t in transports:
        args += ["-t", t]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    on_disk = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert on_disk == report
    return report


def test_tiny_bench_writes_complete_finite_report(tmp_path: Path) -> None:
    transports = ["redis", "kafka"] if _kafka_available() else ["redis"]
    started = time.monotonic()
    report = _run_bench(tmp_path, transports)
    elapsed = time.monotonic() - started

    assert report["meta"]["cpus"] >= 1 and report["meta"]["torch_threads"] >= 1
    ceiling = report["ceilings"]["demo-mlp"]
    assert ceiling["batch_size"] == 256
    for loop in ("forward", "handler"):
        assert _positive(ceiling[loop]["samples_per_s"]) and ceiling[loop]["batches"] > 0

    rq = report["naive_rq"]
    assert rq["fastest"]["worker_class"] == "rq.worker.SimpleWorker"
    assert rq["fastest"]["jobs"] == 60 and _positive(rq["fastest"]["jobs_per_s"])

    assert [s["transport"] for s in report["scenarios"]] == transports
    for s in report["scenarios"]:
        t = s["throughput"]
        assert _positive(t["throughput_rps"]) and _positive(t["window_s"])
        assert 1 <= t["mean_batch_size"] <= s["max_batch_size"]
        assert _positive(t["model_compute_s"]) and _positive(t["cpu_s"]["worker"])
        split = t["time_split"]
        assert _positive(split["mean_e2e_ms"]) and split["mean_queue_ms"] >= 0
        assert _positive(split["mean_compute_ms"])
        assert math.isfinite(t["worker_overhead_us_per_request"]["as_specified"])
        assert [p["load"] for p in s["latency"]] == [0.25, 0.5, 0.8]
        for point in s["latency"]:
            assert point["completed"] == point["arrivals"] > 0
            assert point["statuses"] == {"succeeded": point["completed"]}
            lat = point["latency"]
            assert all(_positive(lat[k]) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms"))
            assert lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"]
            assert _positive(point["offered_rps"]) and _positive(point["achieved_rps"])

    sweep = report["sweep"]
    assert [(p["max_batch_size"], p["max_wait_ms"]) for p in sweep] == [(32, 5.0)]
    assert all(_positive(p["throughput_rps"]) and _positive(p["p99_ms"]) for p in sweep)
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    names = {t["name"] for t in report["targets"]}
    assert "demo-mlp e2e over Redis / naive RQ" in names
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert "## Targets" in markdown and "## Latency" in markdown and "## Sweep" in markdown
    assert elapsed < 90  # generous: the brief asks for under 60 s on an idle two-core box
