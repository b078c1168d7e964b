"""onnxq: post-training INT8 quantization of ONNX models to Q/DQ format.

>>> import onnxq
>>> result = onnxq.quantize("model.onnx", "calib/", backend="tensorrt")  # doctest: +SKIP
>>> result.save("model.int8.onnx")                                       # doctest: +SKIP
"""

from onnxq.errors import (
    AccuracyError,
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    InternalError,
    ModelLoadError,
    OnnxqError,
    OutputError,
    UnsupportedModelError,
    Violation,
)

__version__ = "0.1.0"

from onnxq.api import QuantizedModel, quantize
from onnxq.config import Override, QuantConfig
from onnxq.torch_export import module_pattern, quantize_torch  # imports torch only when called

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
    "UnsupportedModelError",
    "Violation",
    "__version__",
    "module_pattern",
    "quantize",
    "quantize_torch",
]
