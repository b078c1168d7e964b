"""onnxq: post-training INT8 quantization of ONNX models to Q/DQ format.

>>> import onnxq
>>> result = onnxq.quantize("model.onnx", "calib/", backend="tensorrt")  # doctest: +SKIP
>>> result.save("model.int8.onnx")                                       # doctest: +SKIP
"""

from onnxq.api import QuantizedModel, quantize
from onnxq.config import Override, QuantConfig
from onnxq.config.scopes import module_pattern
from onnxq.errors import (
    AccuracyError,
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    InternalError,
    ModelLoadError,
    OnnxqError,
    OutputError,
    ResourceError,
    UnsupportedModelError,
    Violation,
)
from onnxq.pytorch.export import quantize_torch  # imports torch only when called
from onnxq.version import __version__

__all__ = [
    "AccuracyError",
    "BackendConstraintError",
    "CalibrationDataError",
    "ConfigError",
    "InternalError",
    "ModelLoadError",
    "OnnxqError",
    "OutputError",
    "Override",
    "QuantConfig",
    "QuantizedModel",
    "ResourceError",
    "UnsupportedModelError",
    "Violation",
    "__version__",
    "module_pattern",
    "quantize",
    "quantize_torch",
]
