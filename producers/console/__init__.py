"""The operator console (issue 30): a live web page over the fleet (docs/operations.md,
"Console"). Needs the ``gateway`` extra (FastAPI)."""

from batchfleet.producers.console.settings import ConsoleSettings

__all__ = ["ConsoleSettings"]
