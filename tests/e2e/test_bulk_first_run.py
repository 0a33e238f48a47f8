"""``batchfleet bulk run`` at its edges (issue 25, item 13): a run that fails before any
work leaves no files and offers no resume; a finished job's rerun exits as the first run
did; the summary has no blank header row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import run_cli
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e


def _rows(path: Path, n: int, bad_every: int = 0) -> None:
    with path.open("w") as f:
        for i in range(n):
            width = 3 if bad_every and i % bad_every == 0 else 10
            f.write(json.dumps({"inputs": np.full(width, 0.1).tolist()}) + "\n")


@pytest.mark.parametrize("case", ["bad_url", "unknown_model"])
async def test_a_run_that_fails_before_any_work_leaves_nothing_and_offers_no_resume(
        case: str, redis_url: str, tmp_path: Path) -> None:
    _rows(tmp_path / "in.jsonl", 5)
    broker, model = (("redis://127.0.0.1:1/0", "demo-mlp")
                     if case == "bad_url" else (redis_url, "no-such-model"))
    code, _, err = await run_cli(
        "bulk", "run", "-m", model, "-i", str(tmp_path / "in.jsonl"),
        "-o", str(tmp_path / "out.jsonl"), "--broker", broker, "--progress", "none")
    assert code == 1, err
    assert sorted(p.name for p in os.scandir(tmp_path)) == ["in.jsonl"]  # no empty files
    assert "resume" not in err and "progress is saved" not in err
    if case == "unknown_model":  # advice for a CLI user, not the SDK's keyword
        assert "check_model" not in err and "batchfleet models declare" in err


async def test_a_finished_jobs_rerun_exits_as_the_first_run_did(redis_url: str,
                                                                tmp_path: Path) -> None:
    _rows(tmp_path / "in.jsonl", 20, bad_every=2)  # half the rows fail (wrong shape)
    args = ("bulk", "run", "-m", "demo-mlp", "-i", str(tmp_path / "in.jsonl"),
            "-o", str(tmp_path / "out.jsonl"), "--job-id", "edges-rerun",
            "--broker", redis_url, "--progress", "none")
    async with running_worker(redis_url):
        first, out1, _ = await run_cli(*args)
        again, out2, _ = await run_cli(*args)
    assert (first, again) == (1, 1)
    for out in (out1, out2):  # the summary's first row is data, not a blank header
        body = [line for line in out.splitlines() if line.startswith("│")]
        assert body[0].split()[1] == "model"
        assert not any(set(line) <= set("┃ ") for line in out.splitlines() if line)
