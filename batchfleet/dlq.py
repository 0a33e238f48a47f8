"""``batchfleet dlq``'s domain part lives below the CLI, in ``connectors.dlq_ops``
(the gateway calls it too); this module keeps the old import path."""

from __future__ import annotations

from batchfleet.connectors.dlq_ops import DeadLetterOps, ReplayReport, Selection

__all__ = ["DeadLetterOps", "ReplayReport", "Selection"]
