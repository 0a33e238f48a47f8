"""Model handlers: built-ins, user-supplied modules and TorchScript / torch.export files."""

from batchfleet.workers.models.builtin import BUILTIN_MODELS, build_encoder, build_mlp
from batchfleet.workers.models.handler import (
    ModelHandler,
    TensorSpec,
    TorchModuleHandler,
    check_inputs,
    validate_request,
)
from batchfleet.workers.models.loading import (
    load_model,
    load_models,
    load_versions,
    parse_model_spec,
    per_model,
    slots,
    version_lane,
)

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
    "load_versions",
    "parse_model_spec",
    "per_model",
    "slots",
    "validate_request",
    "version_lane",
]
