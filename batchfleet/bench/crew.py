"""Helper processes that generate or consume load, started with ``spawn`` and run in phases.

The bench's load generators (and the broker-only loop's producers and consumer)
run as separate processes, so the process that generates load is never the one
that is measured out of CPU, and each reports its own timings back. Every phase
follows one handshake, so all members start on the same wall-clock instant:

1. the parent sends each member its command;
2. each member prepares (connects, draws its arrivals) and answers ``ready``;
3. the parent picks ``t0`` a few milliseconds ahead and sends it to all;
4. each member runs from ``t0`` and sends back its result (or its traceback).

A member is a top-level coroutine function ``serve(conn, setup)`` that calls
:func:`member_loop`; ``spawn`` gives it a fresh interpreter (no torch import, no
inherited event loop or sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

#: Lead between the last ``ready`` and the common start, so every member sees it in time.
START_LEAD_S = 0.05
_UP_TIMEOUT_S = 120.0
_READY_TIMEOUT_S = 60.0

#: What a member does per command: ``(command, start_at) -> result``, where
#: ``start_at`` is an awaitable helper that sends ``ready`` and returns ``t0``.
Phase = Callable[[Any, Callable[[], Awaitable[float]]], Awaitable[Any]]


class CrewError(RuntimeError):
    """A helper process failed; carries its traceback."""


async def _recv(conn: Connection) -> Any:
    """Receive without blocking the member's event loop (its client keeps running)."""
    if not conn.poll():
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(conn.fileno(), wake)
        try:
            await readable
        finally:
            loop.remove_reader(conn.fileno())
    return conn.recv()


async def member_loop(conn: Connection, phase: Phase) -> None:
    """Serve commands until the parent sends ``None``; answer each with its result."""
    conn.send(("up", None))
    while True:
        command = await _recv(conn)
        if command is None:
            return

        async def start_at() -> float:
            conn.send(("ready", None))
            t0: float = await _recv(conn)
            return t0

        try:
            conn.send(("done", await phase(command, start_at)))
        except Exception:  # reported to the parent, which raises it there
            conn.send(("error", traceback.format_exc()))


class Crew:
    """N spawned members; ``run`` one phase on all of them, ``collect`` their results."""

    def __init__(self, target: Callable[..., None], args: Sequence[tuple[Any, ...]],
                 name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for i, extra in enumerate(args):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(child, *extra), name=f"{name}-{i}",
                               daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._results: dict[int, Any] = {}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def __len__(self) -> int:
        return len(self._procs)

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _expect(self, kind: str, timeout_s: float) -> list[Any]:
        """One message of ``kind`` from every member, in member order."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(self._conns):
            left = deadline - time.monotonic()
            pending = [c for i, c in enumerate(self._conns) if i not in got]
            if left <= 0 or not wait(pending, timeout=left):
                raise CrewError(f"{self.name}: no {kind!r} from a member in {timeout_s:g} s")
            for c in pending:
                if c.poll():
                    i = self._conns.index(c)
                    got[i] = self._message(c, kind)
        return [got[i] for i in range(len(self._conns))]

    def _message(self, conn: Connection, kind: str) -> Any:
        try:
            what, body = conn.recv()
        except EOFError as exc:
            raise CrewError(f"{self.name}: a member exited while the parent waited for "
                            f"{kind!r}") from exc
        if what == "error":
            raise CrewError(f"{self.name}: a member failed:\n{body}")
        if what != kind:
            raise CrewError(f"{self.name}: expected {kind!r}, got {what!r}")
        return body

    def wait_up(self) -> None:
        """Block until every member has started and connected (imports done)."""
        self._expect("up", _UP_TIMEOUT_S)

    def start(self, commands: Sequence[Any]) -> float:
        """Send one command per member, wait for all to be ready; returns the common ``t0``."""
        self._results = {}
        for conn, command in zip(self._conns, commands, strict=True):
            conn.send(command)
        self._expect("ready", _READY_TIMEOUT_S)
        t0 = time.time() + START_LEAD_S
        for conn in self._conns:
            conn.send(t0)
        return t0

    def collect(self, until: float | None) -> bool:
        """Gather results that arrive before wall time ``until`` (None: wait for all);
        True when every member has answered."""
        while len(self._results) < len(self._conns):
            pending = [c for i, c in enumerate(self._conns) if i not in self._results]
            timeout = None if until is None else max(0.0, until - time.time())
            ready = wait(pending, timeout=timeout)
            for c in pending:
                if c in ready:
                    self._results[self._conns.index(c)] = self._message(c, "done")
            if not ready and until is not None and time.time() >= until:
                return False
        return True

    def results(self) -> list[Any]:
        self.collect(None)
        return [self._results[i] for i in range(len(self._conns))]

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()


def sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)
