"""The ordered rule sets that backend profiles name (``BackendProfile.rule_set``).

Order is priority: the first rule of a node's op type that does not decline claims the node.
``tensorrt`` and ``onnxruntime`` place Q/DQ (``onnxq.rewrites.rules``); ``dynamic`` picks the
ops that get onnxruntime's dynamically quantized kernels (``onnxq.rewrites.dynamic``).
"""

from __future__ import annotations

from onnxq.rewrites.dynamic import (
    dynamic_gated_matmul,
    dynamic_gemm,
    dynamic_lstm,
    dynamic_matmul,
)
from onnxq.rewrites.pattern import Rule
from onnxq.rewrites.rules import (
    binary,
    concat,
    conv,
    gemm,
    matmul,
    passthrough,
    residual_add,
    unary,
)

RULE_SETS: dict[str, tuple[Rule, ...]] = {
    "tensorrt": (conv, gemm, matmul, residual_add),
    "onnxruntime": (conv, gemm, matmul, binary, concat, unary, passthrough),
    "dynamic": (dynamic_matmul, dynamic_gated_matmul, dynamic_gemm, dynamic_lstm),
}
