"""The op-facts table: which ONNX ops carry a weight, the axis of its output channels, which
of them add a bias per output channel, and the ops that only move values or build shapes.
Every stage reads these facts from here rather than writing them out again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightAxis:
    """Which axis of an op's weight holds the output channels.

    ``axis`` is used unless ``attribute`` is set and present on the node, in which case
    ``by_attribute[value]`` is used (Gemm: transB=1 -> axis 0, transB=0 -> axis 1).
    A negative axis counts from the end (MatMul's right-hand side ``[K, N]``: -1).
    """

    axis: int
    attribute: str | None = None
    by_attribute: tuple[tuple[int, int], ...] = ()
    input_index: int = 1

    def resolve(self, attrs: dict[str, int], rank: int) -> int:
        """The non-negative axis for a node with these attributes and a weight of ``rank``."""
        axis = self.axis
        if self.attribute is not None:
            value = attrs.get(self.attribute, 0)
            axis = dict(self.by_attribute).get(value, axis)
        return axis % rank if rank else 0


# the ops with a weight (input 1), in the order reports list them (the layers onnxq quantizes
# per channel, ranks for mixed precision, rounds and corrects), and their output-channel axes
# (a backend profile may override them: ``BackendProfile.weight_axes``)
WEIGHT_AXES: dict[str, WeightAxis] = {
    "Conv": WeightAxis(0),
    "ConvTranspose": WeightAxis(1),
    "Gemm": WeightAxis(1, attribute="transB", by_attribute=((1, 0), (0, 1))),
    "MatMul": WeightAxis(-1),
}
WEIGHTED_OP_TYPES: tuple[str, ...] = tuple(WEIGHT_AXES)
WEIGHTED_OPS: frozenset[str] = frozenset(WEIGHTED_OP_TYPES)

# Ops that only move, select or reorder values: their output can share the input's qparams.
PASSTHROUGH_OPS: frozenset[str] = frozenset(
    {
        "MaxPool",
        "Reshape",
        "Transpose",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Relu",
        "Pad",
        "Gather",
        "Split",
        "DepthToSpace",
        "SpaceToDepth",
        "Resize",
        "Identity",
    }
)

# Ops that build shapes and indices: everything downstream of them is never quantized.
SHAPE_OPS: frozenset[str] = frozenset({"Shape", "Size", "NonZero", "Range", "ConstantOfShape"})

# the weighted ops whose input 2 is a bias added per output channel (int32 at the layer's scale
# once quantized); MatMul has no bias input
BIAS_READERS: frozenset[str] = WEIGHTED_OPS - {"MatMul"}
