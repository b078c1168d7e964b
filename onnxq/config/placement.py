"""The placement section: where Q/DQ go and at which precision, which nodes and tensors stay
float, the thresholds of the data-driven exclusions, a dynamic kernel's weight scales and the
half-range shift of non-negative activations; with the values each field allows.

Read by placement (``onnxq.place``), by the profile's choice of opset (the precisions the run
names) and by the report.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from onnxq.config.fields import Section, must, one_of, option
from onnxq.config.overrides import (
    Override,
    TensorSettings,
    check_method,
    check_precision,
    parse_overrides,
)

DYNAMIC_WEIGHT_SCALES = ("auto", "channel", "tensor")
"""``dynamic_weight_scales``: a dynamic kernel's weight scales: one per output column
(``channel``), one for the whole weight (``tensor``), or per weight by
:data:`onnxq.place.rules.dynamic.ONE_SCALE_SQNR_DB` (``auto``)."""

HIGH_PRECISIONS = ("fp16", "bf16", "fp32")
"""``high_precision``: what the float compute a run does not quantize is written in."""

SCORE_MAP_RANGES = ("compare", "minmax", "auto")
"""``score_map_ranges``: what ``method: auto`` means for the activations of a model whose
outputs are per-element sigmoid scores: ``minmax`` for every one (scores and boxes live in the
extremes that clipping cuts), the per-tensor choice of any other model (``auto``), or both
tried and the one with the better fidelity kept (``compare``)."""


@dataclass(frozen=True)
class PlacementOptions(Section):
    """Where Q/DQ go: the range method and precision, what stays float, the data-driven
    exclusions' thresholds, a dynamic kernel's weight scales and the half-range shift.

    Attributes:
        method: activation range method, a name from ``onnxq.numerics.observers.METHODS``.
        precision: the element type of the quantized tensors (``onnxq.numerics.precisions``):
            ``int8`` (the default), ``int16`` (16-bit activations, 8-bit weights, A16W8;
            onnxruntime backend) or ``fp8`` (FP8 E4M3 activations and weights; TensorRT
            backend, opset >= 19); an override's ``precision`` mixes them per tensor or op.
        exclude: glob patterns over node names; matching nodes stay float.  A pattern that
            matches no node but a tensor keeps the tensor's producer float.
        exclude_op_types: glob patterns over op types (``Softmax``); matching nodes stay float.
        exclude_modules: glob patterns over exporter module paths (``encoder.*.attn*``), read
            from the nodes' metadata (torch.onnx dynamo: ``pkg.torch.onnx.name_scopes``,
            ``namespace``) or, without it, from TorchScript-style node-name scopes.
        overrides: per-node/op-type/tensor settings (:class:`Override`).
        min_channels: Conv/Gemm/MatMul with fewer input or output channels stay float
            (INT8 does not pay for them in TensorRT); 0 disables the rule, ``None`` takes the
            backend profile's default.
        mask_threshold: an activation whose calibrated magnitude reaches this stays float (an
            additive attention mask, a fill value: int8 would erase its ordinary values).
        concat_range_ratio: a Concat (onnxruntime backend) whose inputs' ranges differ by more
            than this factor stays float instead of forcing one scale on all of them.
        weak_channel_fraction: a grouped (depthwise) Conv stays float when more than this
            fraction of its input's channels peak below 1/16 of the tensor's peak on the
            calibration data (one per-tensor int8 scale leaves them under 8 levels; each
            channel feeds its own outputs alone); 1 turns the rule off.
        weak_position_fraction: a 1-D Conv whose output reaches a LayerNormalization stays
            float when more than this fraction of its input's positions (frames) peak below
            1/16 of the tensor's peak (the normalisation scales their rounding noise up to full
            size); 1 turns the rule off.
        dynamic_weight_scales: with ``dynamic``, a MatMul/Gemm weight's scales: ``auto`` (one
            scale for the whole weight where that keeps its SQNR >= 30 dB, else one per output
            column: onnxruntime runs one scale faster when few rows are multiplied, as in a
            one-token generation step), ``channel`` (one per column: the most accurate) or
            ``tensor`` (one per weight: the fastest).  An override's ``per_channel: false``
            gives the matched weights one scale.
        score_map_ranges: what ``method: auto`` means for the activations of a model whose
            outputs are per-element sigmoid scores (a detector, a segmentation map):
            ``minmax`` for every activation, ``auto`` the per-tensor choice of any other model,
            or ``compare`` (default): quantize both ways and keep the one whose worst output
            agrees best with float on the fidelity batches (about twice the time; without an
            accuracy target or a calibration cache, else ``minmax``).
        shift_activations: with symmetric integer activations (``tensorrt``), quantize each
            non-negative activation that only Conv/Gemm layers read as ``x - R/2`` on the
            whole grid, ``R`` its range, and add ``R/2`` back through the readers' biases
            (and a Pad of ``-R/2`` where the reader pads): twice the steps over the same
            range, exact in float (``onnxq.place.shift``).
        high_precision: what the float compute the run does not quantize is written in:
            ``fp16`` (each node, with FP32 where the calibration data or the op says so, with
            the reason; ``onnxq.place.precision``) or ``fp32``; ``bf16`` is refused until
            onnxruntime can check a BF16 output; ``None``: the
            backend's choice (``fp16`` for TensorRT, whose networks are strongly typed since
            TensorRT 11; ``fp32`` for onnxruntime).  FP16/BF16 Q/DQ scales need opset 19.
        keep_io_types: graph inputs and outputs keep their FP32 type (a Cast at each edge
            where the graph computes in FP16/BF16); ``false`` gives them the low type.
    """

    method: str = option("auto", lambda name, value: check_method(value, name))
    precision: str = option("int8", lambda name, value: check_precision(value, name))
    exclude: tuple[str, ...] = option(())
    exclude_op_types: tuple[str, ...] = option(())
    exclude_modules: tuple[str, ...] = option(())
    overrides: tuple[Override, ...] = option((), parse=parse_overrides)
    min_channels: int | None = option(None, must(lambda v: v >= 0, "be >= 0"))
    mask_threshold: float = option(1e4, must(lambda v: v > 0, "be > 0"))
    concat_range_ratio: float = option(8.0, must(lambda v: v >= 1, "be >= 1"))
    weak_channel_fraction: float = option(0.25, must(lambda v: 0.0 < v <= 1.0, "be in (0, 1]"))
    weak_position_fraction: float = option(0.25, must(lambda v: 0.0 < v <= 1.0, "be in (0, 1]"))
    dynamic_weight_scales: str = option(
        "auto", one_of(lambda: DYNAMIC_WEIGHT_SCALES, "weight scales")
    )
    score_map_ranges: str = option(
        "compare", one_of(lambda: SCORE_MAP_RANGES, "score-map range choice")
    )
    shift_activations: bool = option(False)
    high_precision: str | None = option(
        None, must(lambda v: v in HIGH_PRECISIONS, "be fp16, bf16 or fp32")
    )
    keep_io_types: bool = option(True)

    def precisions(self) -> list[str]:
        """The precisions the run names: its own, then its overrides' (each once)."""
        named = [self.precision, *(ov.precision for ov in self.overrides if ov.precision)]
        return list(dict.fromkeys(named))

    def node_excluded(self, node_name: str, op_type: str) -> str | None:
        """The pattern that keeps this node float, or ``None``."""
        return node_excluded(self.exclude, self.overrides, node_name, op_type)

    def tensor_excluded(self, tensor_name: str) -> str | None:
        """The override that keeps this tensor float, or ``None``."""
        for ov in self.overrides:
            if ov.exclude and ov.matches_tensor(tensor_name):
                return f"override {ov.describe()} exclude"
        return None

    def settings_for(self, tensor_name: str, consumers: list[tuple[str, str]]) -> TensorSettings:
        """Method, bits, scheme and precision of a tensor: overrides apply in order, field by
        field.

        ``consumers`` lists ``(node_name, op_type)`` of the nodes that read the tensor.
        """
        out = TensorSettings(self.method, precision=self.precision)
        for ov in self.overrides:
            if not (
                ov.matches_tensor(tensor_name) or any(ov.matches_node(n, t) for n, t in consumers)
            ):
                continue
            out = TensorSettings(
                ov.method if ov.method is not None else out.method,
                ov.bits if ov.bits is not None else out.bits,
                ov.per_channel if ov.per_channel is not None else out.per_channel,
                ov.symmetric if ov.symmetric is not None else out.symmetric,
                ov.precision if ov.precision is not None else out.precision,
            )
        return out

    def unmatched(self, nodes: list[tuple[str, str]], tensors: set[str]) -> list[str]:
        """The exclude patterns and overrides that match none of ``nodes`` ((name, op_type)
        pairs) and ``tensors``: a typo that would silently change nothing."""
        out = [
            f"--exclude {p!r}"
            for p in self.exclude
            if not any(fnmatch.fnmatchcase(name, p) for name, _ in nodes)
            and not any(fnmatch.fnmatchcase(t, p) for t in tensors)  # its producer stays float
        ]

        def key(ov: Override) -> tuple[object, ...]:
            # `--method-for GLOB=M` is two overrides, node=GLOB and tensor=GLOB: one suffices
            return (
                {ov.node, ov.op_type, ov.tensor} - {None},
                ov.method,
                ov.exclude,
                ov.bits,
                ov.per_channel,
                ov.symmetric,
                ov.precision,
                ov.block_size,
                ov.algorithm,
            )

        hit = [
            (
                (ov.node is not None or ov.op_type is not None)
                and any(ov.matches_node(name, op) for name, op in nodes)
            )
            or any(ov.matches_tensor(t) for t in tensors)
            for ov in self.overrides
        ]
        matched = [key(ov) for ov, h in zip(self.overrides, hit, strict=True) if h]
        for ov, h in zip(self.overrides, hit, strict=True):
            if not h and key(ov) not in matched:
                matched.append(key(ov))  # said once
                out.append(f"override {ov.describe()}")
        return out


def node_excluded(
    exclude: tuple[str, ...], overrides: tuple[Override, ...], node_name: str, op_type: str
) -> str | None:
    """The ``exclude`` pattern or excluding override that keeps this node float, or ``None``."""
    for pattern in exclude:
        if fnmatch.fnmatchcase(node_name, pattern):
            return f"--exclude {pattern}"
    for ov in overrides:
        if ov.exclude and ov.matches_node(node_name, op_type):
            return f"override {ov.describe()} exclude"
    return None


__all__ = [
    "DYNAMIC_WEIGHT_SCALES",
    "HIGH_PRECISIONS",
    "SCORE_MAP_RANGES",
    "PlacementOptions",
    "node_excluded",
]
