"""Run the ``batchfleet`` CLI in a child process from async tests."""

from __future__ import annotations

import asyncio
import sys


async def run_cli(*args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
    """``batchfleet ARGS`` in a child process, while the test's loop keeps a worker
    running; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode or 0, out.decode(), err.decode()
