"""What a client remembers of the IDs it submitted: their results are announced to it.

A wait on such an ID needs no first read, and a result announced before anyone waits
is kept (its body) rather than lost. The memory is bounded by count and by bytes,
oldest out; what falls out of it is read as any other ID would be
(``producers.waiting``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

#: How many submitted-but-not-yet-awaited IDs are remembered (about 100 bytes each).
EXPECTED_CAP = 100_000
#: How many bytes of announced-but-not-yet-awaited result bodies are kept.
ARRIVED_BYTES_CAP = 64 * 1024 * 1024


class Expected(Mapping[str, "bytes | None"]):
    """Request ID -> None until its announcement came, then the result's body."""

    def __init__(self, cap: int = EXPECTED_CAP, bytes_cap: int = ARRIVED_BYTES_CAP) -> None:
        self._ids: dict[str, bytes | None] = {}
        self._bytes = 0
        self._cap, self._bytes_cap = cap, bytes_cap

    def __getitem__(self, request_id: str) -> bytes | None:
        return self._ids[request_id]

    def __contains__(self, request_id: object) -> bool:  # the dict's, not Mapping's
        return request_id in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> bool:
        """Expect an ID's announcement; False if it was expected (or arrived) already.
        Call :meth:`trim` after a run of these."""
        if request_id in self._ids:
            return False
        self._ids[request_id] = None
        return True

    def discard_unarrived(self, request_id: str) -> None:
        """Stop expecting an ID whose announcement has not come (a result that did stays)."""
        if request_id in self._ids and self._ids[request_id] is None:
            del self._ids[request_id]

    def keep(self, request_id: str, body: bytes) -> None:
        """Hold an announced result until someone waits on it (announced twice: the
        later body, counted once)."""
        before = self._ids.get(request_id)
        self._ids[request_id] = body
        self._bytes += len(body) - (len(before) if before is not None else 0)
        self.trim()

    def take(self, request_id: str) -> bytes | None:
        """Forget an expected ID; its body if its announcement came."""
        body = self._ids.pop(request_id)
        if body is not None:
            self._bytes -= len(body)
        return body

    def trim(self) -> None:
        ids = self._ids
        while len(ids) > self._cap or self._bytes > self._bytes_cap:
            body = ids.pop(next(iter(ids)))
            if body is not None:
                self._bytes -= len(body)

    def forget_unannounced(self) -> None:
        """After the subscription dropped: forget expectations whose announcement may
        have gone into the gap (a wait on them reads the store instead), but keep the
        results that already arrived: the store may have lost them (a restart without
        persistence), and a wait on them must still get them, not a RequestLostError."""
        self._ids = {rid: body for rid, body in self._ids.items() if body is not None}
