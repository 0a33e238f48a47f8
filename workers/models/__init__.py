"""Model handlers: built-ins, user-supplied modules and TorchScript / torch.export files."""

from workers.models.builtin import BUILTIN_MODELS, build_encoder, build_mlp
from workers.models.handler import (
    ModelHandler,
    TensorSpec,
    TorchModuleHandler,
    check_inputs,
)
from workers.models.loading import load_model, load_models, parse_model_spec

__all__ = [
    "BUILTIN_MODELS",
    "ModelHandler",
    "TensorSpec",
    "TorchModuleHandler",
    "build_encoder",
    "build_mlp",
    "check_inputs",
    "load_model",
    "load_models",
    "parse_model_spec",
]
