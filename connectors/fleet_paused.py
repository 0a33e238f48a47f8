"""The models an operator paused (``ModelRegistry.set_paused``: ``models pause``, the
console), read beside a fleet snapshot so ``status --json`` and ``GET /v1/fleet`` carry
them in one document: one pipelined registry read, the one routing makes
(``Routes.tables``), never a scan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchfleet.connectors.control_plane import Routes
    from batchfleet.connectors.fleet import FleetSnapshot
    from batchfleet.schemas.registry import Pause


async def paused_models(routes: Routes, snap: FleetSnapshot) -> dict[str, Pause]:
    """Each model of the snapshot whose lanes are paused, with who, when and why."""
    models = sorted({lane.model for lane in snap.lanes})
    tables = await routes.tables(models) if models else {}
    return {m: t.paused for m, t in sorted(tables.items()) if t.paused is not None}


def fleet_document(snap: FleetSnapshot, paused: dict[str, Pause]) -> dict[str, Any]:
    """The snapshot's JSON with ``paused`` (model -> ``{at, who, why}``) after it."""
    return {**snap.to_json(), "paused": {m: p.to_wire() for m, p in sorted(paused.items())}}
