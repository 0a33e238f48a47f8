"""What flows along the worker's spine: a :class:`Job` (a valid request waiting for
compute), an :class:`Answer` (a terminal result ready to write and ack) and the failure
policy's :class:`Disposition`. Value types only, so intake (which makes jobs),
completion (which makes and writes answers) and the failure policies share them
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import Request, Result


@dataclass(slots=True)
class Job:
    """A valid request waiting for compute, with the delivery it must ack."""

    delivery: Delivery
    request: Request
    #: Set once computed, so even a failure's result names the model version that failed.
    model_version: str = ""
    #: A suspect (redelivered after its worker died): it runs in a batch of its own.
    solo: bool = False
    #: The version label routing chose ("": the model's first version on this worker).
    version: str = ""


@dataclass(slots=True)
class Answer:
    """A terminal result for a delivery, ready to be written and acked."""

    delivery: Delivery
    result: Result
    notify: str | None = None
    generation: int = 0
    #: Where the caller wants the terminal result delivered (a webhook), if anywhere.
    callback_url: str | None = None
    #: How the announcement on ``notify``'s channel is framed (``Request.notify_format``).
    notify_format: str | None = None


@dataclass(slots=True)
class Disposition:
    """What a failure policy did with failed jobs (``workers.failures``)."""

    answers: list[Answer] = field(default_factory=list)
    rescheduled: list[Delivery] = field(default_factory=list)
    #: (model, lane) of each request sent to the DLQ.
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    #: Copies dropped because their request is at a newer generation or already finished.
    superseded: list[Delivery] = field(default_factory=list)
