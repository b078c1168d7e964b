"""How a backend runs weight-only quantized layers: the data of
:attr:`onnxq.backends.profile.BackendProfile.weight_only`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightOnlyFormat:
    """How a backend runs layers whose weights alone are quantized (``--weights int4|int8``).

    Attributes:
        writer: ``matmul_nbits`` (onnxruntime's ``com.microsoft`` MatMulNBits, and
            GatherBlockQuantized for embeddings) or ``dequantize_linear`` (an integer
            initializer behind a DequantizeLinear; opset 21 ``block_size`` for blocks).
        bits: the weight widths it runs.
        blocked_bits: the widths it runs block-wise (others only per output channel).
        symmetric_only: zero points must be 0.
        block_sizes: the block sizes it runs; empty: any power of two from ``min_block_size``.
        min_block_size: the smallest block (with ``block_sizes`` empty).
        embedding_ops: ops whose constant table (an embedding) it runs quantized.
        blocked_opset: the default-domain opset a blocked DequantizeLinear needs.
    """

    writer: str
    bits: frozenset[int]
    blocked_bits: frozenset[int]
    symmetric_only: bool
    block_sizes: frozenset[int] = frozenset()
    min_block_size: int = 16
    embedding_ops: frozenset[str] = frozenset()
    blocked_opset: int = 21
