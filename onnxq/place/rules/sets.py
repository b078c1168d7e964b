"""The ordered rule sets that backend profiles name (``BackendProfile.rule_set``).

Order is priority: the first rule of a node's op type that does not decline claims the node.
``tensorrt`` and ``onnxruntime`` place Q/DQ (``onnxq.place.rules.weighted`` and ``static``);
``dynamic`` picks the ops that get onnxruntime's dynamically quantized kernels
(``onnxq.place.rules.dynamic``).
"""

from __future__ import annotations

from onnxq.place.rules.dynamic import (
    dynamic_gated_matmul,
    dynamic_gemm,
    dynamic_lstm,
    dynamic_matmul,
)
from onnxq.place.rules.pattern import Rule
from onnxq.place.rules.static import binary, concat, passthrough, residual_add, unary
from onnxq.place.rules.weighted import conv, gemm, matmul

RULE_SETS: dict[str, tuple[Rule, ...]] = {
    "tensorrt": (conv, gemm, matmul, residual_add),
    "onnxruntime": (conv, gemm, matmul, binary, concat, unary, passthrough),
    "dynamic": (dynamic_matmul, dynamic_gated_matmul, dynamic_gemm, dynamic_lstm),
}
