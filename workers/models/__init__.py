"""Model handlers: built-ins, user-supplied modules and TorchScript / torch.export files."""

from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.workers.models.builtin import BUILTIN_MODELS, build_encoder, build_mlp
from batchfleet.workers.models.handler import (
    ModelHandler,
    TorchModuleHandler,
    check_inputs,
    validate_request,
)
from batchfleet.workers.models.loading import (
    load_model,
    load_models,
    load_versions,
    parse_model_spec,
)
from batchfleet.workers.models.versions import (
    Versions,
    lanes,
    model_version,
    per_model,
    registry_versions,
    slots,
    version_lane,
)

__all__ = [
    "BUILTIN_MODELS",
    "ModelHandler",
    "TensorSpec",
    "TorchModuleHandler",
    "Versions",
    "build_encoder",
    "build_mlp",
    "check_inputs",
    "lanes",
    "load_model",
    "load_models",
    "load_versions",
    "model_version",
    "parse_model_spec",
    "per_model",
    "registry_versions",
    "slots",
    "validate_request",
    "version_lane",
]
