"""Weight-only quantization: integer MatMul/Gemm weights (int4 blocks, int8), float activations.

``pipeline`` runs it (``onnxq.quantize(..., weights="int4")``); ``targets`` picks the layers and
their formats; ``engine`` chooses their integer weights group by group, with ``blocks`` (round to
nearest with a clip search), ``gptq`` and ``awq``, on inputs that ``layerwise`` computes stage by
stage (``onnxq.ir.stages``) and ``stats`` folds into ``X^T X``; ``onnxq.materialize_blocked``
writes them.  See docs/weight-only.md.
"""
