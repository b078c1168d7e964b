"""Scale out: run the shards of a calibration elsewhere and merge their statistics exactly.

``onnxq.quantize(..., executor=RayExecutor("auto"))`` (``onnxq quantize --ray auto``) observes
the calibration batches as Ray tasks; the output is byte-identical to the run in one process
(docs/scale.md).  :class:`Executor` is the interface: any work that splits into shards whose
results fold in a fixed order can run through it.
"""

from onnxq.scale.executor import Executor, InProcess
from onnxq.scale.ray_executor import RayExecutor

__all__ = ["Executor", "InProcess", "RayExecutor"]
