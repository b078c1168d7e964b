"""What the stages of a weight-only run return, as data: per layer its record, the weighted
ops left float, the weights several layers share, and the verification, with what its layers
have to say (:meth:`WeightOnlyOutcome.notes`).  The messages
(:func:`onnxq.report.messages.messages`) and the report (:mod:`onnxq.weightonly.report`) read
it."""

from __future__ import annotations

from dataclasses import dataclass

from onnxq.backends.profile import BackendProfile
from onnxq.config.recipes import WeightOnlyRecipe
from onnxq.numerics.blocks import BlockFormat
from onnxq.prepare.stage import Prepared
from onnxq.report.messages import GraphView
from onnxq.validate.verify import Verification
from onnxq.weightonly.targets import Layer, Skipped


@dataclass(frozen=True)
class LayerRecord:
    """One quantized layer: ``error`` is the relative error of its output on the calibration
    data (``|X dW|^2 / |X W|^2``), None without data."""

    node: str
    op_type: str
    weight: str
    format: str
    algorithm: str
    why: str
    error: float | None
    note: str = ""


@dataclass(frozen=True)
class SharedWeight:
    """One weight that several layers read: it is stored once, in ``fmt``, rounded to
    nearest."""

    weight: str
    readers: tuple[str, ...]
    fmt: BlockFormat


@dataclass(frozen=True)
class WeightOnlyOutcome:
    """What the stages of a weight-only run returned."""

    config: WeightOnlyRecipe  # what the run read, section by section
    profile: BackendProfile
    prepared: Prepared
    graph: GraphView  # the simplified graph the layers were found in
    layers: list[Layer]
    records: list[LayerRecord]  # per layer: its format, algorithm and error
    skipped: list[Skipped]  # weighted ops left float
    shared: list[SharedWeight]
    weight_bytes: tuple[int, int]  # the quantized weights' float bytes, their stored bytes
    accuracy_level: int | None  # MatMulNBits' (None: the backend writes none)
    calibration_batches: int  # 0: no calibration data
    verification: Verification

    def notes(self) -> list[str]:
        """What its layers have to say: the weights several layers share, the layers with a
        short last block, the accuracy level of the kernels."""
        return [
            *shared_weights(self.shared),
            *short_blocks(self.layers),
            *accuracy_level(self.accuracy_level),
        ]


def shared_weights(shared: list[SharedWeight]) -> list[str]:
    """A note per weight that several layers read."""
    return [
        f"weight {s.weight!r} is read by {len(s.readers)} layers ({', '.join(s.readers)}): "
        f"stored once as {s.fmt.describe()}, rounded to nearest (no single input to calibrate "
        "it against)"
        for s in shared
    ]


def short_blocks(layers: list[Layer]) -> list[str]:
    """Layers whose input size the block size does not divide."""
    short = [x.node for x in layers if x.fmt.block_size and x.k % x.fmt.block_size]
    if not short:
        return []
    return [
        f"{len(short)} layer(s) have an input size that the block size does not divide "
        f"(first: {short[0]}): their last block is shorter (padded with zeros in the file)"
    ]


def accuracy_level(level: int | None) -> list[str]:
    """Which MatMulNBits accuracy level the output asks onnxruntime for."""
    if level is None:
        return []
    return [
        f"MatMulNBits accuracy_level {level}"
        + (": onnxruntime computes with int8-quantized activations" if level == 4 else "")
    ]
