"""The console's few writes, each the operation a CLI command already performs, recorded
with who and when: replay a dead letter (``dlq replay``), cancel a request (``cancel``),
roll back a rollout (``rollout rollback``, whose policy history also keeps who and why),
pause or resume a model's lanes (``ModelRegistry.set_paused``: the registry record keeps
who, when and why while paused; workers stop fetching, ``workers/middleware/pauses.py``).

Each action is logged (``console action``, with who, what and the outcome) and kept in
this process's list of recent actions, which the page shows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from batchfleet.connectors.broker import Broker
from batchfleet.connectors.control_plane import ControlPlane
from batchfleet.connectors.dlq_ops import DeadLetterOps, Selection
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.registry import Pause
from batchfleet.schemas.validation import check_model_name

log = structlog.get_logger("batchfleet.console")

ACTIONS = ("replay", "cancel", "rollback", "pause", "resume")
#: Recent actions the page lists.
KEPT = 50


@dataclass(frozen=True, slots=True)
class Done:
    at: float
    who: str
    action: str
    target: str
    outcome: str


class Actions:
    def __init__(self, plane: ControlPlane, broker: Broker, broker_url: str,
                 results: str | None, namespace: str) -> None:
        self._plane, self._broker = plane, broker
        self._urls = (broker_url, results, namespace)
        self.recent: deque[Done] = deque(maxlen=KEPT)

    def log(self) -> list[dict[str, Any]]:
        return [asdict(d) for d in reversed(self.recent)]

    async def run(self, action: str, body: dict[str, Any], who: str) -> dict[str, Any]:
        if action == "replay":
            target, outcome = await self._replay(body)
        elif action == "cancel":
            target, outcome = await self._cancel(body)
        elif action == "rollback":
            target, outcome = await self._rollback(body, who)
        elif action in ("pause", "resume"):
            target, outcome = await self._pause(body, who, action == "pause")
        else:
            raise ValidationError(f"unknown action {action!r} (known: {', '.join(ACTIONS)})")
        done = Done(time.time(), who, action, target, outcome)
        self.recent.append(done)
        log.info("console action", who=who, action=action, target=target, outcome=outcome)
        return asdict(done)

    @staticmethod
    def _text(body: dict[str, Any], name: str) -> str:
        value = body.get(name)
        if not isinstance(value, str) or not value:
            raise ValidationError(f"missing {name}")
        return value

    async def _replay(self, body: dict[str, Any]) -> tuple[str, str]:
        model, rid = self._text(body, "model"), self._text(body, "request_id")
        check_model_name(model)
        ops = DeadLetterOps(*self._urls)
        try:
            report = await ops.replay_selected(Selection(model=model, request_ids=(rid,)))
        finally:
            await ops.close()
        return rid, "replayed" if report.replayed else "skipped (no longer failed)"

    async def _cancel(self, body: dict[str, Any]) -> tuple[str, str]:
        rid = self._text(body, "request_id")
        control = self._plane.request_control(self._broker)
        try:
            (report,) = await control.cancel([rid])
        finally:
            await control.close()
        return rid, report.message

    async def _rollback(self, body: dict[str, Any], who: str) -> tuple[str, str]:
        model = self._text(body, "model")
        check_model_name(model)
        why = str(body.get("why") or "rolled back from the console")
        policy = await self._plane.rollouts.rollback(model, who=who, why=why)
        return model, f"rolled back: stable {policy.stable}"

    async def _pause(self, body: dict[str, Any], who: str, pause: bool) -> tuple[str, str]:
        model = self._text(body, "model")
        check_model_name(model)
        why = str(body.get("why") or "")
        await self._plane.models.set_paused(model, Pause(time.time(), who, why) if pause
                                            else None)
        return model, "lanes paused" if pause else "lanes resumed"
