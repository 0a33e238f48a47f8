"""The bench's host-speed readings (``bench.host_speed``): what frames a run so that two
runs can be compared."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from batchfleet.bench.host_speed import cpu_ticks, speed_probe_us, steal_pct, wakeup_probe_us
from batchfleet.bench.procstat import children
from batchfleet.bench.report import render_markdown

pytestmark = pytest.mark.unit

STAT = "cpu  100 5 50 800 10 0 5 30 0 0\ncpu0 50 2 25 400 5 0 2 15 0 0\nintr 1 2 3\n"


def test_cpu_ticks_reads_the_steal_and_the_total_of_all_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert cpu_ticks(stat) == (30, 1000)  # guest time (the last two fields) is left out


def test_no_readable_stat_is_no_steal_and_no_error(tmp_path: Path) -> None:
    assert cpu_ticks(tmp_path / "missing") == (0, 0)
    garbled = tmp_path / "stat"
    garbled.write_text("intr 1 2 3\n")
    assert cpu_ticks(garbled) == (0, 0)
    assert steal_pct((0, 0), (0, 0)) == 0.0


def test_steal_is_the_stolen_share_of_the_window_only() -> None:
    assert steal_pct((30, 1000), (80, 1500)) == 10.0  # 50 of 500 ticks in between
    assert steal_pct((30, 1000), (30, 1400)) == 0.0


def test_the_probe_times_real_work() -> None:
    us = speed_probe_us()
    assert math.isfinite(us) and us > 0


def test_the_wakeup_probe_times_real_round_trips_and_leaves_no_child() -> None:
    before = set(children(os.getpid()))
    us = wakeup_probe_us(rounds=3, trips=50)
    assert math.isfinite(us) and us > 1.0  # a trip through another process: not free
    assert set(children(os.getpid())) == before  # its echo child exited, reaped


def test_a_wakeup_probe_that_cannot_run_leaves_the_run_going(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfleet.bench import run

    def broken() -> float:
        raise ConnectionError("the wake-up probe's child went away")
    monkeypatch.setattr(run, "wakeup_probe_us", broken)
    assert run.opening_probes()["host_wakeup_us_start"] is None


def test_the_report_names_the_wakeup_probe_only_when_it_was_taken() -> None:
    meta = {"machine": "Commit x.", "host_speed_us_start": 9000.0, "host_speed_us_end": 9100.0,
            "host_wakeup_us_start": 43.7, "host_wakeup_us_end": 51.25, "steal_pct": 0.0}
    head = render_markdown({"meta": meta}).split("\n## ")[0]
    assert "Wake-up probe: 43.7 us at the start and 51.2 us at the end" in head
    del meta["host_wakeup_us_start"], meta["host_wakeup_us_end"]
    assert "Wake-up probe" not in render_markdown({"meta": meta}).split("\n## ")[0]
    meta["host_wakeup_us_start"], meta["host_wakeup_us_end"] = None, 40.0  # it failed once
    head = render_markdown({"meta": meta}).split("\n## ")[0]
    assert "Wake-up probe" not in head and "stolen by the hypervisor" in head


def test_the_report_names_the_probe_only_when_it_was_taken() -> None:
    meta = {"machine": "Commit x.", "host_speed_us_start": 9000.0, "host_speed_us_end": 12000.0,
            "steal_pct": 1.3}
    head = render_markdown({"meta": meta}).split("\n## ")[0]
    assert "Host speed probe: 9,000 us at the start and 12,000 us at the end" in head
    assert "stolen by the hypervisor during the run: 1.3%" in head
    old = render_markdown({"meta": {"machine": "Commit x."}}).split("\n## ")[0]
    assert "Host speed probe" not in old  # a report from before: re-rendered as it was
