"""The one ``TensorSpec``: what a model accepts (or returns) per request.

It is public (``from batchfleet import TensorSpec``) and used on both sides of the
wire: a handler declares it, intake refuses a request that does not match it, the
model registry stores it (``{dtype, shape}``, docs/wire-format.md) and the SDK checks
a submit against a declared one. It lives in ``schemas`` so that producers, which
never import torch, read the same class the worker writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.validation import check_shape

__all__ = ["DTYPES", "TensorSpec"]

_SPEC: Final = re.compile(r"\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*", re.ASCII)
#: The dtypes a spec may name: those the tensor codec carries.
DTYPES: Final = frozenset({"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                           "int64", "uint64", "float16", "float32", "float64"})


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Dtype and per-request shape, without the batch dimension: ``float32[10]`` on the CLI.

    ``TensorSpec("float32", (3, 224, 224))`` accepts one image per request; the worker
    stacks whole batches of them. Checked at construction: a dtype the codec does not
    carry, or a negative dimension, is a :class:`ValidationError` at once.
    """

    dtype: str
    shape: tuple[int, ...]
    #: Computed once: intake compares every request's signature with it.
    signature: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValidationError(
                f"dtype {self.dtype!r} is not one of {', '.join(sorted(DTYPES))}")
        object.__setattr__(self, "shape", check_shape(list(self.shape), "spec"))
        object.__setattr__(self, "signature",
                           (np.dtype(self.dtype).newbyteorder("<").str, self.shape))

    @classmethod
    def parse(cls, text: str) -> TensorSpec:
        """``float32[10]``, ``int64[64]``, ``float32[3, 224, 224]``, ``float32[]`` (a scalar)."""
        match = _SPEC.fullmatch(text)
        if match is None:
            raise ValidationError(f"spec {text!r} must look like DTYPE[DIM, ...], e.g. float32[10]")
        dims = [d.strip() for d in match.group(2).split(",") if d.strip()]
        return cls(match.group(1), tuple(int(d) for d in dims))

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    def zeros(self, rows: int | None = None) -> np.ndarray:
        """A sample of this spec (``rows`` stacked, or one): warm-up and ``models check``."""
        shape = self.shape if rows is None else (rows, *self.shape)
        return np.zeros(shape, dtype=self.dtype)

    def to_wire(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_wire(cls, obj: Any) -> TensorSpec | None:
        if obj is None:
            return None
        if not isinstance(obj, Mapping) or not isinstance(obj.get("dtype"), str):
            raise ValidationError(f"not a tensor spec: {obj!r}")
        return cls(obj["dtype"], check_shape(obj.get("shape"), "spec"))

    def check(self, inputs: Any) -> None:
        """Refuse inputs of another dtype or shape, with the worker's words for it; a cheap
        check on arrays, never a conversion of what it was given."""
        if isinstance(inputs, dict):
            raise ValidationError(f"expected a single tensor {self.describe()}, got named tensors")
        dtype, want = np.dtype(inputs.dtype), np.dtype(self.dtype)
        if dtype.newbyteorder("<") != want.newbyteorder("<"):
            hint = ""
            if dtype.kind in "iu" and want.kind == "f":
                # JSON whole numbers become int64 on every front door: say how to send floats
                hint = (f" (whole numbers are sent as {inputs.dtype}: send floats, or pass "
                        f"--dtype {self.dtype} / \"dtype\": \"{self.dtype}\")")
            raise ValidationError(f"wrong dtype: expected {self.dtype}, got {inputs.dtype}{hint}")
        if tuple(inputs.shape) != self.shape:
            raise ValidationError(f"wrong shape: expected {self.describe()}, "
                                  f"got {inputs.dtype}{list(inputs.shape)}")
