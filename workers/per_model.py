"""Per-model settings moved to :mod:`batchfleet.schemas.per_model` (layer-neutral: the
settings machinery in ``schemas/settings.py`` needs it); this name stays for the workers."""

from batchfleet.schemas.per_model import ModelKey, PerModel, parse_per_model, split_entry

__all__ = ["ModelKey", "PerModel", "parse_per_model", "split_entry"]
