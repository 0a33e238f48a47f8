"""Device selection for ``--device auto|cpu|cuda[:N]``."""

from __future__ import annotations

import torch

from batchfleet.schemas.errors import ConfigError


def resolve_device(spec: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without it is a start-up error."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {spec}: CUDA is not available on this machine")
        device = torch.device(spec)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
        return device
    raise ConfigError(f"--device {spec!r} must be auto, cpu, cuda or cuda:N")
