"""Dead-letter operations: inspect, replay and purge dead-lettered requests.

A library, so the CLI (``batchfleet dlq``) and the gateway call the same code
and only format what it returns.

Replay re-runs a request under the same ID. Its ``failed`` result is turned
back into ``pending`` under a higher *generation* (a fencing token) and the
request is re-published stamped with it; the result store then refuses any
late write from the older generation, so the replayed run's result is the one
that sticks. Only ``failed`` requests are replayed, and degraded ones (a fallback
answered them, docs/degradation.md): a request that succeeded or expired meanwhile is
left alone. Copies of the older generation still in flight
(in a buffer, or parked for a retry) are dropped unrun by the workers, and the
DLQ keeps at most one letter per request ID and generation.

Every operation pages through whole queues (``XRANGE`` from a cursor, 500 at a
time): there is no cap on how many letters list, replay or purge see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from batchfleet.connectors.broker import OutboundMessage, Publisher
from batchfleet.connectors.control_plane import DeadLetters, Results
from batchfleet.connectors.registry import open_broker, open_control_plane
from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.connectors.values import DeadLetter, reopenable
from batchfleet.schemas.envelopes import Result, decode_request, encode_request, encode_result
from batchfleet.schemas.names import Names


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters an operation is about; empty fields select everything."""

    model: str | None = None
    error_type: str | None = None
    request_ids: Sequence[str] = ()

    def matches(self, dl: DeadLetter) -> bool:
        return ((not self.error_type or dl.last_error_type == self.error_type)
                and (not self.request_ids or dl.request_id in self.request_ids))


@dataclass(slots=True)
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class DeadLetterOps:
    """The DLQ operations behind ``batchfleet dlq`` and the gateway; every one pages
    through whole queues. Errors are the project's (``ResultStoreError``,
    ``TransportError``), never a driver's."""

    def __init__(self, broker: str, results: str | None, namespace: str = "bf") -> None:
        self._broker = BrokerURL.parse(broker)
        self._names = Names(namespace)
        self._plane = open_control_plane(results_url_for(self._broker, results),
                                         namespace=namespace)
        self._broker_door = open_broker(self._broker.url, namespace=namespace)
        self._store: Results = self._plane.results
        self.queue: DeadLetters = self._plane.dead_letters

    async def close(self) -> None:
        await self._plane.close()

    async def pages(self, selection: Selection = Selection()
                    ) -> AsyncIterator[list[DeadLetter]]:
        """Selected letters, oldest first per model, a page at a time. Each (request ID,
        generation) appears once, even where an older worker left duplicates."""
        models = [selection.model] if selection.model else await self.queue.models()
        seen: set[tuple[str, int]] = set()
        for model in models:
            async for page in self.queue.pages(model):
                found = []
                for dl in page:
                    key = (dl.request_id, dl.generation)
                    if selection.matches(dl) and key not in seen:
                        seen.add(key)
                        found.append(dl)
                if found:
                    yield found

    async def letters(self, model: str | None = None, error_type: str | None = None,
                      request_ids: Sequence[str] = ()) -> list[DeadLetter]:
        selection = Selection(model, error_type, tuple(request_ids))
        return [dl async for page in self.pages(selection) for dl in page]

    async def replay_selected(self, selection: Selection) -> ReplayReport:
        """Replay every selected letter, page by page (see :meth:`replay`)."""
        report = ReplayReport()
        publisher = self._broker_door.publisher()
        try:
            async for page in self.queue_pages(selection):
                await self._replay(page, publisher, report)
        finally:
            await publisher.close()
        return report

    async def replay_plan(self, selection: Selection) -> ReplayReport:
        """What :meth:`replay_selected` would do, changing nothing (``dlq replay --dry-run``):
        one read of the selected requests' statuses per page. Only a ``failed`` (or
        half-replayed ``pending``, or degraded) result is replayed; a request is replayed
        once."""
        report = ReplayReport()
        async for page in self.queue_pages(selection):
            ids = list(dict.fromkeys(dl.request_id for dl in page
                                     if dl.request_id not in report.skipped))
            ids = [rid for rid in ids if rid not in report.replayed]
            records = await self._store.get_records(ids, with_body=True)
            for rid, record in zip(ids, records, strict=True):
                if record is not None and reopenable(record.status, record.body):
                    report.replayed.append(rid)
                else:
                    report.skipped[rid] = "its result is no longer 'failed' or degraded"
        return report

    async def queue_pages(self, selection: Selection) -> AsyncIterator[list[DeadLetter]]:
        """Selected letters page by page, duplicates included (replay removes those too)."""
        models = [selection.model] if selection.model else await self.queue.models()
        for model in models:
            async for page in self.queue.pages(model):
                found = [dl for dl in page if selection.matches(dl)]
                if found:
                    yield found

    async def replay(self, letters: Sequence[DeadLetter]) -> ReplayReport:
        """Re-run these letters' requests under their own IDs and a new generation."""
        report = ReplayReport()
        publisher = self._broker_door.publisher()
        try:
            await self._replay(letters, publisher, report)
        finally:
            await publisher.close()
        return report

    async def _replay(self, letters: Sequence[DeadLetter], publisher: Publisher,
                      report: ReplayReport) -> None:
        """Reopen, publish, then remove the letters (a crash before the removal leaves them
        to be replayed again, which only supersedes the first replay). One request ID is
        replayed once per run: its other letters are removed as duplicates."""
        chosen: dict[str, DeadLetter] = {}
        done: list[DeadLetter] = []
        replayed = set(report.replayed)
        for dl in letters:
            if dl.request_id in replayed or dl.request_id in chosen:
                report.skipped.setdefault(dl.request_id, "replayed once already in this run")
                done.append(dl)
            else:
                chosen[dl.request_id] = dl
        requests = [decode_request(dl.envelope) for dl in chosen.values()]
        pending = [(r.request_id, encode_result(Result(r.request_id, "pending", model=r.model,
                                                       enqueued_at=r.enqueued_at)))
                   for r in requests]
        generations = await self._store.reopen_for_replay(pending)
        messages = []
        for dl, req, gen in zip(chosen.values(), requests, generations, strict=True):
            done.append(dl)
            if gen < 0:
                report.skipped[dl.request_id] = "its result is no longer 'failed' or degraded"
                continue
            fresh = replace(req, attempt=1, history=[], generation=gen)
            messages.append(OutboundMessage(req.model, req.lane, req.request_id,
                                            encode_request(fresh)))
            report.replayed.append(req.request_id)
        await publisher.publish(messages)
        await self.queue.remove(done)

    async def purge(self, model: str | None) -> int:
        """Delete a model's dead letters, or every model's when None; returns how many."""
        models = [model] if model else await self.queue.models()
        return sum([await self.queue.purge(m) for m in models])
