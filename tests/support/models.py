"""User models for tests, loaded by the worker through ``NAME=tests.support.models:factory``."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from batchfleet.workers.models.builtin import build_mlp

#: A demo-mlp input whose first feature is this value makes the poison model raise.
POISON = -999.0
#: A demo-mlp input whose first feature is this value makes the crash model kill its process.
CRASH = -777.0


class PoisonSensitive(nn.Module):
    """demo-mlp, except that any batch containing a poison row raises; with ``pace_s``,
    each batch also takes that long, so a run lasts long enough to be disrupted."""

    def __init__(self, pace_s: float = 0.0) -> None:
        super().__init__()
        self.inner = build_mlp()
        self.pace_s = pace_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pace_s:
            time.sleep(self.pace_s)
        if bool((x[:, 0] == POISON).any()):
            raise RuntimeError("poison input in batch")
        if bool((x[:, 0] == CRASH).any()):
            os._exit(17)
        return self.inner(x)  # type: ignore[no-any-return]


class WrongCount(nn.Module):
    """Returns one output too few: the worker must call that an error, not mis-assign rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:-1, :1]


def poison_model() -> TorchModuleHandler:
    return TorchModuleHandler("poison", PoisonSensitive(),
                              input_spec=TensorSpec("float32", (10,)))


def paced_poison_model() -> TorchModuleHandler:
    """The poison model at 10 ms a batch: 5,000 requests in batches of 32 take a worker
    about 1.6 s, whatever the host, so disruptions tied to the backlog cannot all be
    missed (on a fast host the plain model drained it between two looks)."""
    return TorchModuleHandler("poison", PoisonSensitive(pace_s=0.01),
                              input_spec=TensorSpec("float32", (10,)))


def wrong_count_model() -> nn.Module:
    return WrongCount()


class Switchable(nn.Module):
    """demo-mlp that raises on every batch while ``broken`` is set (a bad deploy, say)."""

    def __init__(self, broken: bool = False, broken_until: float = 0.0) -> None:
        super().__init__()
        self.inner = build_mlp()
        self.broken = broken
        self.broken_until = broken_until
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        self.calls += 1
        if self.broken or time.monotonic() < self.broken_until:
            raise RuntimeError("model backend unavailable")
        if bool((x[:, 0] == POISON).any()):
            raise RuntimeError("poison input in batch")
        return self.inner(x)  # type: ignore[no-any-return]


def switchable(module: Switchable, name: str = "switch") -> TorchModuleHandler:
    return TorchModuleHandler(name, module, input_spec=TensorSpec("float32", (10,)))


#: A demo-mlp input whose first feature is this value makes the slow model hang for 2 s.
SLOW = -555.0


class Sleepy(nn.Module):
    """demo-mlp that stalls on a marker row, as a wedged kernel or driver would."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        if bool((x[:, 0] == SLOW).any()):
            time.sleep(2.0)
        return self.inner(x)  # type: ignore[no-any-return]


class SlowMLP(nn.Module):
    """demo-mlp at 20 ms a batch: the fleet, not the producer, is the bottleneck."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(0.02)
        return self.inner(x)  # type: ignore[no-any-return]


class NonFinite(nn.Module):
    """Finite float32[10] in, float32[4] out: NaN, +Infinity, -Infinity, then the first input.

    Real models do this (0/0, an overflowing exp); the JSON bodies must say ``null``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = x[:, :1]
        inf = first * 0.0 + float("inf")
        return torch.cat([first / 0.0 * 0.0, inf, -inf, first], dim=1)


def non_finite_model(name: str = "nan-out") -> TorchModuleHandler:
    return TorchModuleHandler(name, NonFinite(), input_spec=TensorSpec("float32", (10,)))


class Wedged(nn.Module):
    """A forward that takes far longer than any grace period: a wedged model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(120)
        return x[:, :1]


def sleepy_model() -> TorchModuleHandler:
    return TorchModuleHandler("sleepy", Wedged(), input_spec=TensorSpec("float32", (10,)))


#: The flaky canary fails every request whose second feature is this value.
FLAKY = -3.0  # not 0: warm-up batches are zeros


class FailsSome(nn.Module):
    """demo-mlp, except that a batch holding a row whose second feature is :data:`FLAKY`
    raises (bisection then fails exactly those rows): a test that sends that value in
    one request in five gets a canary that fails a deterministic 20%."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 1] == FLAKY).any()):
            raise RuntimeError("flaky canary: this input fails")
        return self.inner(x)  # type: ignore[no-any-return]


def flaky_canary() -> TorchModuleHandler:
    """Served as a version: ``--model demo-mlp@flaky=tests.support.models:flaky_canary``."""
    return TorchModuleHandler("flaky", FailsSome(), input_spec=TensorSpec("float32", (10,)))


#: How long the slow shadow waits per forward.
SHADOW_WAIT_S = 0.5


class WaitsThenMLP(nn.Module):
    """demo-mlp after a 0.5 s wait per batch, as a GPU-bound or remote model waits."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SHADOW_WAIT_S)
        return self.inner(x)  # type: ignore[no-any-return]


def slow_shadow() -> TorchModuleHandler:
    """Served as a version: ``--model demo-mlp@slow=tests.support.models:slow_shadow``."""
    return TorchModuleHandler("slow", WaitsThenMLP(), input_spec=TensorSpec("float32", (10,)))


#: A demo-mlp input whose first feature is this value makes the hang model sleep an hour.
HANG = 7.0


class Hangs(nn.Module):
    """demo-mlp that hangs for an hour on a marker row: a wedged kernel, driver or lock."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] == HANG).any()):
            time.sleep(3600)
        return self.inner(x)  # type: ignore[no-any-return]


def hang_model() -> TorchModuleHandler:
    return TorchModuleHandler("hang", Hangs(), input_spec=TensorSpec("float32", (10,)))


#: How long the paced model takes per batch; its slow twin takes three times as long.
PACE_S = 0.03


class Paced(nn.Module):
    """demo-mlp after a fixed wait per batch: compute time set by the test, not by how busy
    the machine is (the latency guard's "truly slower" canary)."""

    def __init__(self, wait_s: float) -> None:
        super().__init__()
        self.inner = build_mlp()
        self.wait_s = wait_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.wait_s)
        return self.inner(x)  # type: ignore[no-any-return]


def paced_mlp() -> TorchModuleHandler:
    """``--model paced=tests.support.models:paced_mlp``: demo-mlp at 30 ms a batch."""
    return TorchModuleHandler("paced", Paced(PACE_S), input_spec=TensorSpec("float32", (10,)))


def paced_mlp_3x() -> TorchModuleHandler:
    """The same at 90 ms a batch: three times slower on every batch."""
    return TorchModuleHandler("paced-3x", Paced(3 * PACE_S),
                              input_spec=TensorSpec("float32", (10,)))


class FileSwitched(nn.Module):
    """demo-mlp that raises on every batch while ``path`` exists: a test heals it by
    removing the file (a model whose backend comes back)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.inner = build_mlp()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.path.exists(self.path):
            raise RuntimeError("model backend unavailable")
        return self.inner(x)  # type: ignore[no-any-return]


def file_switched(path: str, name: str = "flaky") -> TorchModuleHandler:
    return TorchModuleHandler(name, FileSwitched(path), input_spec=TensorSpec("float32", (10,)))


def demo_mlp(name: str = "backup", seed: int = 7) -> TorchModuleHandler:
    """Another demo-mlp (other weights): a sturdier model to fall back on."""
    return TorchModuleHandler(name, build_mlp(seed=seed), input_spec=TensorSpec("float32", (10,)))


def paced(seconds: float, name: str = "slow") -> TorchModuleHandler:
    """demo-mlp at ``seconds`` a batch, whatever its size: a slow model."""
    return TorchModuleHandler(name, Paced(seconds), input_spec=TensorSpec("float32", (10,)))
