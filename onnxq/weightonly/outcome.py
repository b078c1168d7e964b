"""What the stages of a weight-only run return, as data: per layer its record, the weighted
ops left float, the weights several layers share, and the verification.  The messages
(:mod:`onnxq.weightonly.messages`) and the report (:mod:`onnxq.weightonly.report`) read it."""

from __future__ import annotations

from dataclasses import dataclass

from onnxq.backends.profile import BackendProfile
from onnxq.config import QuantConfig
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

    config: QuantConfig
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
