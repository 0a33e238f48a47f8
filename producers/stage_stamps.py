"""When each result reached the client, for diagnosing the caller's tail (off by default).

Between the worker's ``finished_at`` and the caller's wake-up a result passes through
the terminal write and its announcement (Redis pub/sub), the client's listener (which
receives and decodes a whole announcement at once) and the caller's own task, which
must be scheduled on a busy loop. ``AsyncClient.record_stages()`` turns this on: the
listener then stamps each announced result twice (received, delivered to its waiter),
once per announcement, and the caller pops the stamps when it takes the result
(``batchfleet bench`` reports the stages' percentiles). Bounded, oldest out, so a
client that never pops cannot grow without limit.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Results whose stamps are kept at most (about 100 bytes each).
DEFAULT_LIMIT = 200_000


class StageStamps:
    """Request ID -> (received, delivered) wall-clock times, bounded."""

    __slots__ = ("_limit", "_stamps")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._stamps: dict[str, tuple[float, float]] = {}

    def record(self, request_ids: Iterable[str], received: float, delivered: float) -> None:
        stamps = self._stamps
        for rid in request_ids:
            stamps[rid] = (received, delivered)
        while len(stamps) > self._limit:
            del stamps[next(iter(stamps))]

    def pop(self, request_id: str) -> tuple[float, float] | None:
        """The stamps of one result (None if it was not announced: read back instead)."""
        return self._stamps.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._stamps)
