"""Instructions Redis executes per request on the submit and write paths:
``python -m tests.support.redis_instructions [--requests 2048] [--per-call 256]``.

Starts ``redis-server`` under ``valgrind --tool=callgrind`` on a free loopback port and
sends requests through the real one-trip submit (``OneTripSubmit.submit``) and the real
terminal write (``ResultStore.write_terminal``, one client's ``results`` announcements),
dumping callgrind's counters around each so each path's instructions are its own. Run it
twice, at two commits, to compare script changes: an instruction count does not move
with this machine's load or clock, where Redis's CPU time does. The "Redis scripts" row
of docs/performance.md comes from this script. Needs valgrind and redis-server on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.embedded_server import free_port
from batchfleet.connectors.redis_submit import OneTripSubmit
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.values import Ownership, TerminalWrite
from batchfleet.producers.client import new_request_id
from batchfleet.schemas.envelopes import NOTIFY_RESULTS
from batchfleet.schemas.names import LANE_INTERACTIVE, Names


def _instructions_since_last_dump(out_dir: Path, pid: int) -> int:
    """callgrind_control writes a numbered part per dump; its ``summary:`` line totals it."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    part = max(out_dir.glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
    for line in part.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {part}")


async def _measure(port: int, out_dir: Path, pid: int, requests: int, per_call: int
                   ) -> dict[str, float]:
    client = aioredis.Redis(port=port)
    store = ResultStore(client, Names("probe"))
    submit = OneTripSubmit(store)
    payload, pending, body = os.urandom(276), os.urandom(204), os.urandom(298)
    owner = Ownership(notify="client1")

    def messages(ids: list[str]) -> list[OutboundMessage]:
        return [OutboundMessage("demo-mlp", LANE_INTERACTIVE, i, payload) for i in ids]

    def writes(ids: list[str]) -> list[TerminalWrite]:
        return [TerminalWrite(i, "succeeded", body, "client1", 0, NOTIFY_RESULTS) for i in ids]

    try:
        await submit.submit([("warm", pending)], [owner], messages(["warm"]))  # loads the
        await store.write_terminal(writes(["warm"]))  # scripts outside the counted parts
        ids = [new_request_id() for _ in range(requests)]
        calls = [ids[i:i + per_call] for i in range(0, requests, per_call)]
        _instructions_since_last_dump(out_dir, pid)
        for chunk in calls:
            await submit.submit([(i, pending) for i in chunk], [owner] * len(chunk),
                                messages(chunk))
        submitted = _instructions_since_last_dump(out_dir, pid)
        for chunk in calls:
            if not all(await store.write_terminal(writes(chunk))):
                raise RuntimeError("a first write lost")
        written = _instructions_since_last_dump(out_dir, pid)
    finally:
        await client.aclose()
    return {"submit": submitted / requests, "write": written / requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--per-call", type=int, default=256)
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/callgrind.out.%p",
             "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while subprocess.run(["redis-cli", "-p", str(port), "ping"], check=False,
                                 capture_output=True, text=True).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server under valgrind did not start in 60 s")
                time.sleep(0.5)
            found = asyncio.run(_measure(port, out_dir, server.pid, args.requests,
                                         args.per_call))
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"Redis instructions per request, {args.requests} requests, {args.per_call} a call: "
          + ", ".join(f"{path} {count:,.0f}" for path, count in found.items()))


if __name__ == "__main__":
    main()
