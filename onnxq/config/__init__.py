"""QuantConfig: every option of a quantization run, as one frozen, validated value.

The same object is built from CLI flags, from Python keyword arguments and from a YAML file
(:meth:`QuantConfig.from_yaml`); ``to_yaml`` writes it back so a run can be reproduced.

A field is declared once, in :class:`QuantConfig`: its type annotation says which Python
values it takes (what YAML and ``from_dict`` accept, and what a wrong value's error names), and
:func:`~onnxq.config.fields.option` adds a value check and, for the few fields that take another
form too, a parser.  Each field belongs to one section (:mod:`onnxq.config.sections`), and a stage
reads the fields it uses through its options view (:mod:`onnxq.config.options`).

To add a field: declare it here with its check, give it a section, document it in the docstring
below and in ``docs/config.md`` (a test holds the two together), and list it in the options view
of the stage that reads it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from onnxq.backends.profile import BACKENDS
from onnxq.config.choices import (
    ADAROUND_MODES,
    CALIBRATION_MODES,
    WEIGHT_ALGORITHMS,
    WEIGHT_ONLY,
    WEIGHT_STORAGE,
    check_engine,
)
from onnxq.config.fields import (
    check_cpu_class,
    check_target,
    checked_fields,
    must,
    one_of,
    option,
    plain_fields,
    preprocess_spec,
    read_yaml,
    settle,
    share_of,
)
from onnxq.config.options import (
    DYNAMIC_WEIGHT_SCALES,
    SCORE_MAP_RANGES,
    TARGET_COSTS,
    AccuracyOptions,
    CalibrationOptions,
    PlacementOptions,
    RecoveryOptions,
    TargetOptions,
    WeightOnlyOptions,
    WeightOptions,
    view,
)
from onnxq.config.overrides import (
    Override,
    TensorSettings,
    check_method,
    check_precision,
)
from onnxq.numerics.qparams import WEIGHT_METHODS
from onnxq.runtime.device import is_device


@dataclass(frozen=True)
class QuantConfig:
    """All options of one quantization run.

    Attributes:
        backend: ``tensorrt`` (symmetric int8, per-channel weights; the default) or
            ``onnxruntime`` (Q/DQ groups that onnxruntime's CPU kernels fuse).
        method: activation range method, a name from ``onnxq.numerics.observers.METHODS``.
        percentile: the percentile kept by the ``percentile`` method (0 < p <= 100).
        exclude: glob patterns over node names; matching nodes stay float.  A pattern that
            matches no node but a tensor keeps the tensor's producer float.
        exclude_op_types: glob patterns over op types (``Softmax``); matching nodes stay float.
        exclude_modules: glob patterns over exporter module paths (``encoder.*.attn*``), read
            from the nodes' metadata (torch.onnx dynamo: ``pkg.torch.onnx.name_scopes``,
            ``namespace``) or, without it, from TorchScript-style node-name scopes.
        overrides: per-node/op-type/tensor settings (:class:`Override`).
        max_batches: use at most this many calibration batches (``None``: all).
        fidelity_batches: how many calibration batches are kept to measure the quantized model
            against the float model.
        weight_storage: ``int8`` (int8 initializer + DequantizeLinear) or ``qdq`` (float
            initializer + QuantizeLinear -> DequantizeLinear).
        weight_method: per-channel weight range: ``minmax`` (each channel's largest
            magnitude) or ``mse`` (the per-channel clip with the least squared error).
        bias_correction: subtract from each quantized Conv/ConvTranspose/Gemm/MatMul layer's
            float bias the mean output shift its weight rounding causes, measured per channel
            on the calibration data (one extra pass; ``onnxq.recover.bias_correction``).
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
        precision: the element type of the quantized tensors (``onnxq.numerics.precisions``):
        ``int8``
            (the default), ``int16`` (16-bit activations, 8-bit weights, A16W8; onnxruntime
            backend) or ``fp8`` (FP8 E4M3 activations and weights; TensorRT backend, opset
            >= 19); an override's ``precision`` mixes them per tensor or op.
        dynamic: dynamic quantization (onnxruntime backend): int8 weights written ahead of
            time; activations quantized at run time by onnxruntime's
            DynamicQuantizeMatMul / MatMulIntegerToFloat / DynamicQuantizeLSTM kernels.  No
            calibration data is needed (given, it only feeds the fidelity check).
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
        reduce_range: 7-bit int8 weights for the onnxruntime backend (its u8s8 CPU kernels
            saturate int16 sums on x86 CPUs without VNNI), or full-range int8 (False);
            ``None`` decides from ``target_cpu`` (uint8-stored 8-bit weights on ``x86-avx2``).
        target_cpu: the CPU class an onnxruntime output is tuned for (weight range, cost
            thresholds): ``x86-avx2``, ``x86-vnni``, ``arm64``, ``arm64-dot``, ``other``;
            ``None``: the ``ONNXQ_TARGET_CPU`` environment variable, else this machine's.
        cost_table: a cost-threshold table written by ``onnxq tune-cpu`` (JSON) to use instead
            of the shipped table of the target class.
        memory_budget_mb: activations of one batch that calibration may hold at once; when
            the observed tensors need more, they are observed in groups, one pass each.
        histogram_sample: values per sample that go into a tensor's histogram: a sample with
            more contributes every s-th value (s prime, coprime to its dimensions); min/max
            always see every value; 0 puts every value in the histogram (slower).
        histogram_budget: values that one tensor's histogram counts over the whole
            calibration: with more samples than ``histogram_budget / histogram_sample``, each
            sample contributes fewer values (its share, rounded down to a power of two, at
            least 1024); 0: no budget.  Calibrations of up to 256 samples are not affected.
        agreement_threshold: the fidelity check compares each sigmoid output of the model at
            this threshold too (the share of values on the same side in both models).
        preprocess: how a folder of images becomes model inputs: a preset (``imagenet``,
            ``0-1``, ``tf``) or a spec (docs/calibration.md); in YAML also a mapping.
        simplify: run the simplify passes before placing Q/DQ.
        progress: show progress bars on stderr.
        target_accuracy: ``METRIC=VALUE`` (``cosine=0.999``; metrics in
            ``onnxq.numerics.accuracy_target.METRICS``): keep the fewest, most harmful layers float
            until the metric reaches VALUE on held-out batches (``onnxq.mixed.search``);
            ``None``: no search.
        heldout_batches: batches held out to measure the accuracy target: the first ones of
            the calibration data, which calibration then skips (at most a quarter of them),
            unless held-out data is given.
        target_cost: what the accuracy target's search minimises: ``layers`` (the fewest
            float layers, most sensitive first) or ``macs`` (the fewest multiply-adds left out
            of INT8: layers by gain per multiply-add; ``onnxq.mixed.float_cost``).
        target_max_float_macs: the most of the model's multiply-adds the accuracy target's
            search may leave out of INT8, a share (``0.1``, or ``"10%"``); the search keeps
            the best model within it and says when the target is missed
            (``onnxq.mixed.float_budget``); ``None``: no ceiling.
        device: where the calibration and validation sessions run: ``cpu``, or ``cuda`` /
            ``cuda:N`` (onnxruntime's CUDA execution provider: the ``onnxruntime-gpu``
            package and a CUDA device; ``onnxq.runtime.device``).
        weight_only: ``None`` (INT8 Q/DQ of weights and activations) or ``int4`` / ``int8``:
            weight-only quantization of MatMul/Gemm weights (and embedding tables where the
            backend runs them), activations untouched (docs/weight-only.md).
        block_size: weight-only: weights share a scale per block of this many input rows
            (``None``: 128 for int4, per channel for int8; 0: one scale per output channel);
            a backend without blocks for the width (TensorRT int8) uses per-channel scales.
        weight_algorithm: weight-only: ``rtn`` (round to nearest, error-minimising clip
            search), ``gptq``, ``awq``, ``awq+gptq``, or ``auto`` (the measured default:
            ``awq+gptq`` with calibration data, ``rtn`` without).
        weight_symmetric: weight-only: zero points fixed at 0 (TensorRT needs it) or an
            integer zero point per block (onnxruntime).
        weight_accuracy_level: weight-only, onnxruntime: MatMulNBits' ``accuracy_level``
            (0-4; 4 computes with int8 activations); ``None``: the measured default.
        cle: cross-layer equalization of Conv -> (Relu | LeakyRelu | PRelu | nothing) ->
            Conv pairs before calibration (an exact float rewrite; ``onnxq.recover.cle``).
        dw_equalization: for Conv -> (Relu | LeakyRelu | PRelu | Clip(0, hi) | nothing) ->
            depthwise Conv, scale the channels between them up to one range, each by at most
            this factor (weights quantized per channel do not change;
            ``onnxq.recover.dwequal``); ``0``: off.
        shift_activations: with symmetric integer activations (``tensorrt``), quantize each
            non-negative activation that only Conv/Gemm layers read as ``x - R/2`` on the
            whole grid, ``R`` its range, and add ``R/2`` back through the readers' biases
            (and a Pad of ``-R/2`` where the reader pads): twice the steps over the same
            range, exact in float (``onnxq.place.shift``).
        smoothquant: SmoothQuant's migration strength ``alpha`` in (0, 1] for the inputs of
            quantized MatMul/Gemm layers (an exact float rewrite from per-channel maxima on the
            calibration data; ``onnxq.recover.smoothquant``); ``0``: off.
        smoothquant_min_spread: SmoothQuant leaves an input alone whose largest channel peak
            is less than this many times the median channel's (no outliers to migrate).
        calibration_mode: ``float`` (ranges from the float model) or ``prefix`` (measured again
            with every earlier layer quantized: two more passes; ``onnxq.recover.prefix``).
        adaround: learn the rounding of every quantized Conv/Gemm/MatMul weight from its
            layer's inputs and outputs on the calibration data (``onnxq.recover.adaround``).
        adaround_steps: optimisation steps per layer.
        adaround_rows: input rows per layer that AdaRound's statistics are taken from.
        adaround_engine: ``numpy`` or ``torch`` (when installed; the same steps, same
            integers but for ties within float error).
        adaround_mode: ``float`` (every layer fitted on the float model's inputs, one pass)
            or ``sequential`` (layer by layer on its inputs in the quantized model, earlier
            layers already rounded, against the float output, kept where the model's output
            error drops: about three passes per layer; ``onnxq.recover.seqround``) or
            ``block`` (the layers of each block of Convs learned together against the
            block's float output, its input from the quantized prefix, kept where the model's
            output error drops; ``onnxq.recover.blockround``).
        sequential_correction: remove each quantized layer's mean output shift from its bias,
            measured layer by layer with every earlier layer quantized and corrected, kept
            where the model's output error goes down (about two passes over the calibration
            data per layer; ``onnxq.recover.sequential``).
        range_search: choose each activation's clip range, tensor by tensor in graph order,
            by the model's output error among a small grid of ranges, kept where the error on
            held-apart batches drops (``onnxq.recover.rangesearch``).
        range_search_batches: the range search reads at most this many calibration batches
            (half to choose, half to judge; ``None``: as many as ``max_batches``).
    """

    backend: str = option("tensorrt", one_of(lambda: BACKENDS, "backend"))
    method: str = option("auto", lambda name, value: check_method(value, name))
    percentile: float = option(99.99, must(lambda v: 0.0 < v <= 100.0, "be in (0, 100]"))
    exclude: tuple[str, ...] = option(())
    exclude_op_types: tuple[str, ...] = option(())
    exclude_modules: tuple[str, ...] = option(())
    overrides: tuple[Override, ...] = option(())
    max_batches: int | None = option(None, must(lambda v: v >= 1, "be >= 1"))
    fidelity_batches: int = option(4, must(lambda v: v >= 0, "be >= 0"))
    weight_storage: str = option("int8", one_of(lambda: WEIGHT_STORAGE, "weight storage"))
    weight_method: str = option("mse", one_of(lambda: WEIGHT_METHODS, "weight method"))
    bias_correction: bool = option(False)
    min_channels: int | None = option(None, must(lambda v: v >= 0, "be >= 0"))
    mask_threshold: float = option(1e4, must(lambda v: v > 0, "be > 0"))
    concat_range_ratio: float = option(8.0, must(lambda v: v >= 1, "be >= 1"))
    weak_channel_fraction: float = option(0.25, must(lambda v: 0.0 < v <= 1.0, "be in (0, 1]"))
    weak_position_fraction: float = option(0.25, must(lambda v: 0.0 < v <= 1.0, "be in (0, 1]"))
    precision: str = option("int8", lambda name, value: check_precision(value, name))
    dynamic: bool = option(False)
    dynamic_weight_scales: str = option(
        "auto", one_of(lambda: DYNAMIC_WEIGHT_SCALES, "weight scales")
    )
    score_map_ranges: str = option(
        "compare", one_of(lambda: SCORE_MAP_RANGES, "score-map range choice")
    )
    reduce_range: bool | None = option(None)
    target_cpu: str | None = option(None, lambda name, value: check_cpu_class(value, name))
    cost_table: str | None = option(None)
    memory_budget_mb: int = option(4096, must(lambda v: v >= 1, "be >= 1"))
    histogram_sample: int = option(65536, must(lambda v: v >= 0, "be >= 0"))
    histogram_budget: int = option(2**24, must(lambda v: v >= 0, "be >= 0"))
    agreement_threshold: float = option(0.5)
    preprocess: str | None = option(None, also=(dict,), parse=preprocess_spec)
    simplify: bool = option(True)
    progress: bool = option(True)
    target_accuracy: str | None = option(None, lambda name, value: check_target(value, name))
    heldout_batches: int = option(16, must(lambda v: v >= 1, "be >= 1"))
    target_cost: str = option("layers", one_of(lambda: TARGET_COSTS, "cost"))
    target_max_float_macs: float | None = option(
        None,
        must(lambda v: 0 <= v <= 1, "be a share in [0, 1]"),
        also=(str,),
        parse=lambda value: share_of(value, "target_max_float_macs"),
    )
    device: str = option("cpu", must(is_device, "be cpu, cuda or cuda:N"))
    weight_only: str | None = option(None, must(lambda v: v in WEIGHT_ONLY, "be int4 or int8"))
    block_size: int | None = option(None, must(lambda v: v >= 0, "be >= 0 (0: per channel)"))
    weight_algorithm: str = option("auto", one_of(lambda: WEIGHT_ALGORITHMS, "algorithm"))
    weight_symmetric: bool = option(True)
    weight_accuracy_level: int | None = option(None, must(lambda v: 0 <= v <= 4, "be 0..4"))
    cle: bool = option(False)
    dw_equalization: float = option(0.0, must(lambda v: v == 0 or v >= 1, "be 0 (off) or >= 1"))
    shift_activations: bool = option(False)
    smoothquant: float = option(0.8, must(lambda v: 0.0 <= v <= 1.0, "be in [0, 1]"))
    smoothquant_min_spread: float = option(8.0, must(lambda v: v >= 1, "be >= 1"))
    calibration_mode: str = option("float", one_of(lambda: CALIBRATION_MODES, "mode"))
    adaround: bool = option(False)
    adaround_steps: int = option(500, must(lambda v: v >= 0, "be >= 0"))
    adaround_rows: int = option(4096, must(lambda v: v >= 1, "be >= 1"))
    adaround_engine: str = option("numpy", check_engine)
    adaround_mode: str = option("float", one_of(lambda: ADAROUND_MODES, "mode"))
    sequential_correction: bool = option(False)
    range_search: bool = option(False)
    range_search_batches: int | None = option(None, must(lambda v: v >= 2, "be >= 2"))

    def __post_init__(self) -> None:
        settle(self)  # values from Python are checked like those from YAML: type, then value

    @property
    def target(self) -> TargetOptions:
        """The options that choose the backend profile and the CPU class it is tuned for."""
        return view(TargetOptions, self)

    @property
    def placement(self) -> PlacementOptions:
        """The options placement reads."""
        return view(PlacementOptions, self)

    @property
    def calibration(self) -> CalibrationOptions:
        """The options calibration reads."""
        return view(CalibrationOptions, self)

    @property
    def weights(self) -> WeightOptions:
        """The options the weight passes (materialize, bias correction) read."""
        return view(WeightOptions, self)

    @property
    def accuracy(self) -> AccuracyOptions:
        """The options the mixed-precision search reads."""
        return view(AccuracyOptions, self)

    @property
    def weight_only_options(self) -> WeightOnlyOptions:
        """The options a weight-only run reads (``weight_only`` set)."""
        return view(WeightOnlyOptions, self)

    @property
    def recovery(self) -> RecoveryOptions:
        """The options the accuracy-recovery steps (``onnxq.recover``) read."""
        return view(RecoveryOptions, self)

    def node_excluded(self, node_name: str, op_type: str) -> str | None:
        """The pattern that keeps this node float, or ``None``."""
        return self.placement.node_excluded(node_name, op_type)

    def tensor_excluded(self, tensor_name: str) -> str | None:
        """The override that keeps this tensor float, or ``None``."""
        return self.placement.tensor_excluded(tensor_name)

    def settings_for(self, tensor_name: str, consumers: list[tuple[str, str]]) -> TensorSettings:
        """Method, bits, scheme and precision of a tensor
        (:meth:`PlacementOptions.settings_for`)."""
        return self.placement.settings_for(tensor_name, consumers)

    def unmatched(self, nodes: list[tuple[str, str]], tensors: set[str]) -> list[str]:
        """The exclude patterns and overrides that match nothing (a typo)."""
        return self.placement.unmatched(nodes, tensors)

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML/JSON-ready), overrides as dicts without ``None`` fields."""
        return plain_fields(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> QuantConfig:
        """Build from a dict, naming unknown keys and wrong types. Fields may be given flat
        (``adaround: true``) or under their section (``recovery: {adaround: true}``;
        :mod:`onnxq.config.sections`)."""
        return cls(**checked_fields(cls, data, where))

    @classmethod
    def from_sparsebit(cls, doc: dict[str, Any], where: str = "config") -> QuantConfig:
        """Map a Sparsebit qconfig (the parsed YAML mapping; :mod:`onnxq.config.sparsebit`)."""
        from onnxq.config.sparsebit import sparsebit_options

        return cls(**sparsebit_options(doc, where))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> QuantConfig:
        """Load a YAML config file (safe loader: no code runs); a Sparsebit qconfig (top-level
        ``BACKEND`` / ``W`` / ``A``) is read as :meth:`from_sparsebit` reads it."""
        from onnxq.config.sparsebit import is_sparsebit

        data = read_yaml(path)
        if is_sparsebit(data):
            return cls.from_sparsebit(data, where=str(path))
        return cls.from_dict(data or {}, where=str(path))

    def to_yaml(self) -> str:
        """YAML text that :meth:`from_yaml` reads back to an equal config."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)


__all__ = [
    "BACKENDS",
    "WEIGHT_ALGORITHMS",
    "WEIGHT_METHODS",
    "WEIGHT_ONLY",
    "WEIGHT_STORAGE",
    "Override",
    "QuantConfig",
]
