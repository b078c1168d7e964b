"""What each stage of the pipeline reads of a :class:`~onnxq.config.QuantConfig`.

A stage takes the small value it uses, not the whole config: choosing the backend profile (and
the CPU class it is tuned for) a :class:`TargetOptions`, placement a :class:`PlacementOptions`,
calibration a :class:`CalibrationOptions`, the weight passes (materialize, bias correction) a
:class:`WeightOptions`, a weight-only run (``onnxq.weightonly``) a :class:`WeightOnlyOptions`, the
accuracy-recovery steps a :class:`RecoveryOptions`.
Each is a view over QuantConfig fields of the same names and types (``QuantConfig.placement``
and friends build them; a test holds the two declarations together), so a field is declared
once, in QuantConfig, and a stage that needs it lists it here.  They have no defaults of their
own: the defaults are QuantConfig's (``QuantConfig().placement``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Any, TypeVar

from onnxq.config.overrides import Override, TensorSettings


@dataclass(frozen=True)
class TargetOptions:
    """What choosing the run's backend profile reads (``onnxq.backends.target.profile_for``):
    the backend; for a backend whose output depends on the CPU the class it is tuned for, the
    cost table of that class and the weight range; the precisions the run and its overrides
    name, and whether activations are quantized at run time (``dynamic``)."""

    backend: str
    reduce_range: bool | None
    target_cpu: str | None
    cost_table: str | None
    precision: str
    dynamic: bool
    overrides: tuple[Override, ...]

    def precisions(self) -> list[str]:
        """The precisions the run names: its own, then its overrides' (each once)."""
        named = [self.precision, *(ov.precision for ov in self.overrides if ov.precision)]
        return list(dict.fromkeys(named))


@dataclass(frozen=True)
class PlacementOptions:
    """What placement reads: which nodes and tensors stay float, the per-tensor settings (the
    run's precision among them), the small-op threshold, the thresholds of the data-driven
    exclusions (:data:`onnxq.place.exclusions.EXCLUSIONS` names each by its field), how a
    dynamic kernel's weight is scaled and whether non-negative activations are shifted onto
    the whole symmetric grid (:mod:`onnxq.place.shift`)."""

    method: str
    precision: str
    exclude: tuple[str, ...]
    exclude_op_types: tuple[str, ...]
    exclude_modules: tuple[str, ...]
    overrides: tuple[Override, ...]
    min_channels: int | None
    mask_threshold: float
    concat_range_ratio: float
    weak_channel_fraction: float
    weak_position_fraction: float
    dynamic_weight_scales: str
    score_map_ranges: str
    shift_activations: bool

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


@dataclass(frozen=True)
class CalibrationOptions:
    """What calibration reads: how many batches, how much memory, how histograms sample, and
    the percentile that turns statistics into a range."""

    max_batches: int | None
    fidelity_batches: int
    memory_budget_mb: int
    histogram_sample: int
    histogram_budget: int
    percentile: float
    progress: bool


@dataclass(frozen=True)
class WeightOptions:
    """What the weight passes read (materialize, bias correction): how weights are stored and
    how their per-channel range is chosen."""

    weight_storage: str
    weight_method: str


# what the accuracy target's search minimises (onnxq.mixed.float_cost)
DYNAMIC_WEIGHT_SCALES = ("auto", "channel", "tensor")
"""``dynamic_weight_scales``: a dynamic kernel's weight scales: one per output column
(``channel``), one for the whole weight (``tensor``), or per weight by
:data:`onnxq.place.rules.dynamic.ONE_SCALE_SQNR_DB` (``auto``)."""

SCORE_MAP_RANGES = ("compare", "minmax", "auto")
"""``score_map_ranges``: what ``method: auto`` means for the activations of a model whose
outputs are per-element sigmoid scores: ``minmax`` for every one (scores and boxes live in the
extremes that clipping cuts), the per-tensor choice of any other model (``auto``), or both
tried and the one with the better fidelity kept (``compare``)."""

TARGET_COSTS = ("layers", "macs")


@dataclass(frozen=True)
class AccuracyOptions:
    """What the mixed-precision search reads (``onnxq.mixed.search``): the accuracy target
    (``METRIC=VALUE``; None: no search), how many batches are held out to measure it, what the
    search minimises and the most multiply-adds it may leave float (a share; None: any)."""

    target_accuracy: str | None
    heldout_batches: int
    target_cost: str
    target_max_float_macs: float | None


@dataclass(frozen=True)
class WeightOnlyOptions:
    """What a weight-only run reads (``onnxq.weightonly``): the width, block size, algorithm
    and scheme of the layers, which nodes stay float and the per-layer overrides, how many
    calibration batches it uses and keeps for the fidelity check, and progress output."""

    weight_only: str | None
    block_size: int | None
    weight_algorithm: str
    weight_symmetric: bool
    weight_accuracy_level: int | None
    exclude: tuple[str, ...]
    overrides: tuple[Override, ...]
    max_batches: int | None
    fidelity_batches: int
    progress: bool

    def node_excluded(self, node_name: str, op_type: str) -> str | None:
        """The pattern that keeps this layer float, or ``None``."""
        return node_excluded(self.exclude, self.overrides, node_name, op_type)


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


@dataclass(frozen=True)
class RecoveryOptions:
    """What the accuracy-recovery steps read (``onnxq.recover``): which algorithms run, and
    AdaRound's effort."""

    cle: bool
    dw_equalization: float
    smoothquant: float
    smoothquant_min_spread: float
    calibration_mode: str
    adaround: bool
    adaround_steps: int
    adaround_rows: int
    adaround_engine: str
    adaround_mode: str
    sequential_correction: bool
    range_search: bool
    range_search_batches: int | None


View = TypeVar(
    "View",
    TargetOptions,
    PlacementOptions,
    CalibrationOptions,
    WeightOptions,
    AccuracyOptions,
    WeightOnlyOptions,
    RecoveryOptions,
)


def view(cls: type[View], config: Any) -> View:
    """The stage options ``cls`` with the values of ``config``'s fields of the same names."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


__all__ = [
    "TARGET_COSTS",
    "AccuracyOptions",
    "CalibrationOptions",
    "PlacementOptions",
    "RecoveryOptions",
    "TargetOptions",
    "WeightOnlyOptions",
    "WeightOptions",
    "view",
]
