"""Shared state of the ``memory://`` backend: one in-process store per URL name.

``memory://NAME`` (``memory://`` is ``memory://default``) names a store that lives as
long as the process. Every control plane and broker opened with the same name and
namespace shares it, so a ``Client("memory://")`` and a worker started in the same
process talk to each other, as they would over one Redis.

Why a lock and wake-ups that cross threads: the blocking ``Client`` runs its own event
loop on a thread, beside the worker's loop. Each operation holds :attr:`MemoryState.lock`
for its whole read-check-write, which is what a Lua script's atomicity gives on Redis;
a waiter (a consumer's blocking read, a subscription) is woken with
``call_soon_threadsafe`` on its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from batchfleet.schemas.errors import ConfigError

SCHEME = "memory"
DEFAULT_NAME = "default"
#: How often expired result records are swept out (on a write), beside the lazy check.
SWEEP_EVERY_S = 10.0


def memory_name(url: str) -> str:
    """The store's name in ``memory://NAME`` (``default`` when empty)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != SCHEME:
        raise ConfigError(f"not a memory:// URL: {url!r}")
    return (parts.netloc + parts.path).strip("/") or DEFAULT_NAME


class Wakeup:
    """Wakes coroutines waiting on any thread's loop when something changed.

    A waiter passes the :attr:`version` it saw before it looked, so a change made
    between its look and its wait is never missed."""

    def __init__(self) -> None:
        self.version = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._lock = threading.Lock()

    def notify(self) -> None:
        with self._lock:
            self.version += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: its waiter is gone
                loop.call_soon_threadsafe(event.set)

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once :attr:`version` moves past ``seen``, or after ``timeout_s``."""
        if timeout_s <= 0:
            return
        event = asyncio.Event()
        key = (asyncio.get_running_loop(), event)
        with self._lock:
            if self.version != seen:
                return
            self._waiters.add(key)
        try:  # asyncio.timeout, not wait_for: 3.11's drops a cancel (``cancelling``)
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(key)


@dataclass(slots=True)
class Pending:
    """One entry a consumer group has handed out and not yet seen acked (a PEL entry)."""

    consumer: str
    delivered_at: float
    count: int = 1


@dataclass(slots=True)
class Group:
    #: Entries handed out and not acked, in entry-ID order.
    pending: dict[tuple[int, int], Pending] = field(default_factory=dict)
    #: The last entry handed out as new (``>``).
    last: tuple[int, int] = (0, 0)


@dataclass(slots=True)
class Stream:
    """A lane: entries by ID (ordered, like a Redis stream) and its consumer groups."""

    entries: dict[tuple[int, int], bytes] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)


@dataclass(slots=True)
class Subscriber:
    """One announcement subscription: messages queued until its ``next`` reads them."""

    messages: deque[bytes] = field(default_factory=deque)
    wakeup: Wakeup = field(default_factory=Wakeup)
    closed: bool = False


class MemoryState:
    """Everything one ``memory://NAME`` store holds, for one namespace."""

    def __init__(self, namespace: str = "bf") -> None:
        self.namespace = namespace
        self.lock = threading.RLock()
        #: request ID -> the record's fields (status, gen, body, owner, fp, notify,
        #: deliveries, solo, stalls, dlq), as the Redis hash holds them.
        self.records: dict[str, dict[str, Any]] = {}
        #: request ID -> epoch seconds at which the record expires (absent: never).
        self.expiry: dict[str, float] = {}
        self.subscribers: dict[str, list[Subscriber]] = {}
        self.lane_losses: dict[str, int] = {}
        #: Ordered logs' claims: log -> (highest offset handed out, newest timestamp ms).
        self.log_claims: dict[str, tuple[int, int]] = {}
        #: owner -> request IDs in flight (what the terminal write frees; quotas).
        self.inflight: dict[str, dict[str, float]] = {}
        self.streams: dict[tuple[str, str], Stream] = {}
        self.stream_wakeup = Wakeup()
        #: Plain key-value seams (heartbeats, cache, …): key -> (value, expires or None).
        self.kv: dict[str, tuple[Any, float | None]] = {}
        self._ids = itertools.count(1)
        self._next_sweep = time.time() + SWEEP_EVERY_S
        self._last_ms = 0

    def next_id(self) -> tuple[int, int]:
        """A stream-entry-like ID, (epoch ms, sequence), always increasing."""
        ms = max(int(time.time() * 1000), self._last_ms)
        self._last_ms = ms
        return ms, next(self._ids)

    # -- result records ---------------------------------------------------------------

    def record(self, rid: str) -> dict[str, Any] | None:
        """The live record (an expired one is dropped first, as Redis would)."""
        expires = self.expiry.get(rid)
        if expires is not None and expires <= time.time():
            self.records.pop(rid, None)
            self.expiry.pop(rid, None)
        return self.records.get(rid)

    def touch(self, rid: str) -> dict[str, Any]:
        """The record, created empty when missing (what HSET/HINCRBY on a new key does)."""
        found = self.record(rid)
        if found is None:
            found = self.records[rid] = {}
        return found

    def expire(self, rid: str, ttl_s: float) -> None:
        now = time.time()
        self.expiry[rid] = now + ttl_s
        if now >= self._next_sweep:  # what Redis's active expiry does: nothing read again
            self._next_sweep = now + SWEEP_EVERY_S  # lingers past its TTL for long
            for gone in [r for r, at in self.expiry.items() if at <= now]:
                self.delete(gone)
            for key in [k for k, (_, at) in self.kv.items() if at is not None and at <= now]:
                del self.kv[key]

    def expire_if_none(self, rid: str, ttl_s: float) -> None:
        self.expiry.setdefault(rid, time.time() + ttl_s)

    def delete(self, rid: str) -> None:
        self.records.pop(rid, None)
        self.expiry.pop(rid, None)

    # -- key-value seams --------------------------------------------------------------

    def get(self, key: str) -> Any:
        found = self.kv.get(key)
        if found is None:
            return None
        value, expires = found
        if expires is not None and expires <= time.time():
            del self.kv[key]
            return None
        return value

    def set(self, key: str, value: Any, ttl_s: float | None = None) -> None:
        self.kv[key] = (value, None if ttl_s is None else time.time() + ttl_s)

    def setdefault(self, key: str, factory: Any) -> Any:
        value = self.get(key)
        if value is None:
            value = factory()
            self.set(key, value)
        return value

    # -- announcements ----------------------------------------------------------------

    def publish(self, client_id: str, message: bytes) -> None:
        for sub in self.subscribers.get(client_id, ()):
            if not sub.closed:
                sub.messages.append(message)
                sub.wakeup.notify()


_STATES: dict[tuple[str, str], MemoryState] = {}
_STATES_LOCK = threading.Lock()


def memory_state(url: str, namespace: str) -> MemoryState:
    """The shared state of ``url``'s store for one namespace (created on first use)."""
    key = (memory_name(url), namespace)
    with _STATES_LOCK:
        state = _STATES.get(key)
        if state is None:
            state = _STATES[key] = MemoryState(namespace)
        return state


def reset_memory(url: str | None = None) -> None:
    """Forget a store (every namespace of it), or every store with no ``url``: a test's
    clean slate. Planes and brokers still open keep the state they hold."""
    with _STATES_LOCK:
        if url is None:
            _STATES.clear()
            return
        name = memory_name(url)
        for key in [k for k in _STATES if k[0] == name]:
            del _STATES[key]
