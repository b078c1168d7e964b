"""A weighted layer as a matrix product: rows of its input times its weight, group by group.

Conv, Gemm and MatMul all compute, for each output position, ``W_g @ row`` where ``row`` is the
input values one output reads (a Conv's patch, a Gemm's input row) and ``W_g`` the weight of
that position's group, shaped ``[outputs per group, row length]``.  AdaRound, the sensitivity
search and any other per-layer reconstruction work on that form: :class:`LinearLayer` says how
to cut a layer's input into rows (:meth:`LinearLayer.rows`) and how its weight maps to and from
the ``[groups, outputs, row length]`` matrix (:meth:`LinearLayer.matrix`, :meth:`LinearLayer.
from_matrix`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.ir.ops import WEIGHTED_OPS

# the weighted ops but ConvTranspose: its weight is [inputs, outputs / group, ...] and each output
# gathers a scattered set of inputs, not one patch, so it is no row-times-matrix layer here
LAYER_OPS = WEIGHTED_OPS - {"ConvTranspose"}


@dataclass(frozen=True)
class LinearLayer:
    """How one Conv/Gemm/MatMul reads its input: kernel geometry (Conv), or which side of the
    product its weight is on (Gemm/MatMul)."""

    node: str
    op_type: str
    input: str  # the activation the layer reads (input 0)
    weight: str  # the constant weight (input 1)
    weight_shape: tuple[int, ...]
    groups: int = 1
    kernel: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()  # begins then ends (explicit; auto_pad resolved per input)
    auto_pad: str = "NOTSET"
    trans_a: bool = False  # Gemm
    trans_b: bool = False  # Gemm: weight stored [N, K]

    @property
    def row_length(self) -> int:
        """Values per row (per group for a grouped Conv)."""
        if self.op_type == "Conv":
            return int(np.prod(self.weight_shape[1:]))
        return self.weight_shape[1] if self.trans_b else self.weight_shape[0]

    @property
    def outputs(self) -> int:
        """Output channels in all."""
        if self.op_type == "Conv":
            return self.weight_shape[0]
        return self.weight_shape[0] if self.trans_b else self.weight_shape[1]

    def matrix(self, weight: np.ndarray) -> np.ndarray:
        """``weight`` as ``[groups, outputs per group, row length]`` (a copy for Gemm/MatMul)."""
        if self.op_type == "Conv":
            return weight.reshape(self.groups, weight.shape[0] // self.groups, -1)
        return (weight if self.trans_b else weight.T)[None]

    def from_matrix(self, matrix: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`matrix`: back to the weight's own layout."""
        if self.op_type == "Conv":
            return matrix.reshape(self.weight_shape)
        flat = matrix[0]
        return np.ascontiguousarray(flat if self.trans_b else flat.T)

    def channel_axis(self) -> int:
        """The axis of the weight that holds output channels."""
        if self.op_type == "Conv":
            return 0
        return 0 if self.trans_b else 1

    def positions(self, x: np.ndarray) -> int:
        """Rows (output positions) that one batch of input ``x`` gives, per group."""
        if self.op_type != "Conv":
            return int(x.size // max(self.row_length, 1))
        spatial = self._out_shape(x.shape)
        return int(x.shape[0] * math.prod(spatial))

    def rows(self, x: np.ndarray, take: np.ndarray | None = None) -> np.ndarray:
        """The rows of input ``x``, ``[groups, rows, row length]``, float32; only the rows at
        flat indices ``take`` (over :meth:`positions`) when given."""
        if self.op_type != "Conv":
            flat = x.T if self.trans_a else x.reshape(-1, x.shape[-1])
            picked = flat if take is None else flat[take]
            return np.asarray(picked, dtype=np.float32)[None]
        return self._patches(np.asarray(x, dtype=np.float32), take)

    # -- Conv ------------------------------------------------------------------------------
    def _pads_for(self, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
        dims = len(self.kernel)
        if self.auto_pad in ("NOTSET", ""):
            pads = list(self.pads) or [0] * (2 * dims)
            return pads[:dims], pads[dims:]
        if self.auto_pad == "VALID":
            return [0] * dims, [0] * dims
        begins, ends = [], []
        for size, k, s, d in zip(shape[2:], self.kernel, self.strides, self.dilations, strict=True):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begin = small if self.auto_pad == "SAME_UPPER" else total - small
            begins.append(begin)
            ends.append(total - begin)
        return begins, ends

    def _out_shape(self, shape: tuple[int, ...]) -> list[int]:
        begins, ends = self._pads_for(shape)
        return [
            (size + b + e - ((k - 1) * d + 1)) // s + 1
            for size, b, e, k, s, d in zip(
                shape[2:], begins, ends, self.kernel, self.strides, self.dilations, strict=True
            )
        ]

    def _patches(self, x: np.ndarray, take: np.ndarray | None) -> np.ndarray:
        dims = len(self.kernel)
        begins, ends = self._pads_for(x.shape)
        padded = np.pad(x, [(0, 0), (0, 0), *zip(begins, ends, strict=True)])
        reach = [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True)]
        spatial = tuple(range(2, 2 + dims))
        windows = np.lib.stride_tricks.sliding_window_view(padded, reach, axis=spatial)
        out = self._out_shape(x.shape)
        steps = tuple(slice(0, o * s, s) for o, s in zip(out, self.strides, strict=True))
        taps = tuple(slice(None, None, d) for d in self.dilations)
        picks: tuple[slice, ...] = (slice(None), slice(None), *steps, *taps)
        windows = windows[picks]  # N C *out *kernel
        n, c = x.shape[:2]
        per_group = c // self.groups
        windows = windows.reshape(n, self.groups, per_group, *out, *self.kernel)
        # [G, N, *out, C/G, *kernel]: a row is one output position's patch of its group
        order = (1, 0, *range(3, 3 + dims), 2, *range(3 + dims, 3 + 2 * dims))
        windows = windows.transpose(order)
        if take is None:
            return windows.reshape(self.groups, -1, self.row_length)
        index: tuple[Any, ...] = (slice(None), *np.unravel_index(take, (n, *out)))
        return windows[index].reshape(self.groups, len(take), self.row_length)


def linear_layer(graph: ir.Graph, node: onnx.NodeProto) -> LinearLayer | str:
    """The :class:`LinearLayer` of ``node``, or why it is not one (a reason)."""
    if node.op_type not in LAYER_OPS:
        return f"{node.op_type} is not a Conv, Gemm or MatMul"
    if len(node.input) < 2 or graph.const_value(node.input[1]) is None:
        return "its weight (input 1) is not a constant"
    weight = graph.const_value(node.input[1])
    assert weight is not None
    attrs = ir.node_attrs(node)
    shape = tuple(int(d) for d in weight.shape)
    if node.op_type == "MatMul":
        if weight.ndim != 2:
            return f"its weight has rank {weight.ndim}, not 2 (a batched product)"
        return LinearLayer(node.name, "MatMul", node.input[0], node.input[1], shape)
    if node.op_type == "Gemm":
        return LinearLayer(
            node.name,
            "Gemm",
            node.input[0],
            node.input[1],
            shape,
            trans_a=bool(attrs.get("transA", 0)),
            trans_b=bool(attrs.get("transB", 0)),
        )
    dims = weight.ndim - 2
    if dims < 1:
        return f"its weight has rank {weight.ndim}; a Conv weight has rank 3 or more"
    return LinearLayer(
        node.name,
        "Conv",
        node.input[0],
        node.input[1],
        shape,
        groups=int(attrs.get("group", 1)),
        kernel=shape[2:],
        strides=tuple(attrs.get("strides", [1] * dims)),
        dilations=tuple(attrs.get("dilations", [1] * dims)),
        pads=tuple(attrs.get("pads", [0] * (2 * dims))),
        auto_pad=_text(attrs.get("auto_pad", "NOTSET")),
    )


def _text(value: object) -> str:
    """A string attribute's value (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)
