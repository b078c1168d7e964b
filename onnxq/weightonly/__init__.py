"""Weight-only quantization: integer MatMul/Gemm weights (int4 blocks, int8), float activations.

``pipeline`` runs it (``onnxq.quantize(..., weight_only="int4")``) between the shared
``onnxq.prepare.stage`` and ``onnxq.validate.verify`` stages; ``targets`` picks the layers and their
formats; ``engine`` chooses their integer weights group by group, with ``blocks`` (round to
nearest with a clip search), ``gptq`` and ``awq``, on inputs that ``layerwise`` computes stage
by stage (``onnxq.ir.stages``) and ``stats`` folds into ``X^T X``; ``onnxq.materialize.blocked``
writes them; ``messages`` and ``report`` say what happened.  See docs/weight-only.md.
"""

from onnxq.config.weightonly import WEIGHT_ALGORITHMS, WEIGHT_ONLY

__all__ = ["WEIGHT_ALGORITHMS", "WEIGHT_ONLY"]
