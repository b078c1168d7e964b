"""QuantConfig: every option of a quantization run, as one frozen, validated value.

The same object is built from CLI flags, from Python keyword arguments and from a YAML file
(:meth:`QuantConfig.from_yaml`); ``to_yaml`` writes it back so a run can be reproduced.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxq.errors import ConfigError

BACKENDS = ("tensorrt", "onnxruntime")
WEIGHT_STORAGE = ("int8", "qdq")


@dataclass(frozen=True)
class Override:
    """Per-node settings, matched by glob over node name, op type or tensor name.

    A field left at ``None`` keeps the global setting.  ``exclude=True`` keeps the matched nodes
    (or, with ``tensor``, the matched tensors) in float.  ``bits`` (2-8) narrows the integer
    range inside the int8/uint8 storage; ``per_channel`` (weights) and ``symmetric``
    (activations; the TensorRT backend only allows symmetric) change the scheme.
    When several overrides match, the later one wins field by field.
    """

    node: str | None = None
    op_type: str | None = None
    tensor: str | None = None
    method: str | None = None
    exclude: bool = False
    bits: int | None = None
    per_channel: bool | None = None
    symmetric: bool | None = None

    def __post_init__(self) -> None:
        if self.node is None and self.op_type is None and self.tensor is None:
            raise ConfigError(
                "overrides: each entry needs at least one of 'node', 'op_type' or 'tensor' "
                "(a glob pattern); got an entry with none"
            )
        if self.method is not None:
            _check_method(self.method, "overrides[].method")
        if self.bits is not None and (isinstance(self.bits, bool) or not 2 <= self.bits <= 8):
            raise ConfigError(f"overrides[].bits: must be an integer 2..8, got {self.bits!r}")

    def matches_node(self, node_name: str, op_type: str) -> bool:
        """True if this override's node/op_type patterns (those given) all match."""
        if self.tensor is not None and self.node is None and self.op_type is None:
            return False
        if self.node is not None and not fnmatch.fnmatchcase(node_name, self.node):
            return False
        return self.op_type is None or fnmatch.fnmatchcase(op_type, self.op_type)

    def matches_tensor(self, tensor_name: str) -> bool:
        """True if this override names tensors and ``tensor_name`` matches."""
        return self.tensor is not None and fnmatch.fnmatchcase(tensor_name, self.tensor)


def _check_method(name: str, where: str) -> None:
    from onnxq.observers import METHODS

    if name not in METHODS:
        raise ConfigError(
            f"{where}: unknown calibration method {name!r}; valid: {', '.join(sorted(METHODS))}"
        )


@dataclass(frozen=True)
class TensorSettings:
    """The resolved per-tensor settings (``None``: the backend's default)."""

    method: str
    bits: int = 8
    per_channel: bool = True
    symmetric: bool | None = None


@dataclass(frozen=True)
class QuantConfig:
    """All options of one quantization run.

    Attributes:
        backend: ``tensorrt`` (symmetric int8, per-channel weights; the default) or
            ``onnxruntime`` (Q/DQ groups that onnxruntime's CPU kernels fuse).
        method: activation range method, a name from ``onnxq.observers.METHODS``.
        percentile: the percentile kept by the ``percentile`` method (0 < p <= 100).
        exclude: glob patterns over node names; matching nodes stay float.
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
            on the calibration data (one extra pass; ``onnxq.bias_correction``).
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
        reduce_range: 7-bit weights for the onnxruntime backend (its u8s8 CPU kernels saturate
            int16 sums on x86 CPUs without VNNI); ``None`` decides from the CPU.
        memory_budget_mb: activations of one batch that calibration may hold at once; when
            the observed tensors need more, they are observed in groups, one pass each.
        histogram_sample: values per sample that go into a tensor's histogram: a sample with
            more contributes every s-th value (s prime, coprime to its dimensions); min/max
            always see every value; 0 puts every value in the histogram (slower).
        histogram_budget: values that one tensor's histogram counts over the whole
            calibration: with more samples than ``histogram_budget / histogram_sample``, each
            sample contributes fewer values (its share, rounded down to a power of two, at
            least 1024); 0: no budget.  Calibrations of up to 256 samples are not affected.
        preprocess: how a folder of images becomes model inputs: a preset (``imagenet``,
            ``0-1``, ``tf``) or a spec (docs/calibration.md); in YAML also a mapping.
        simplify: run the simplify passes before placing Q/DQ.
        progress: show progress bars on stderr.
        cle: cross-layer equalization of Conv -> (Relu | LeakyRelu | PRelu | nothing) -> Conv
            pairs before calibration (an exact float rewrite; ``onnxq.recover.cle``).
        smoothquant: SmoothQuant's migration strength ``alpha`` in (0, 1] for the inputs of
            quantized MatMul/Gemm layers (an exact float rewrite from per-channel maxima on the
            calibration data; ``onnxq.recover.smoothquant``); ``None``: off.
        calibration_mode: ``float`` (ranges from the float model) or ``prefix`` (measured again
            with every earlier layer quantized: one more pass; ``onnxq.recover.prefix``).
        adaround: learn the rounding of every quantized Conv/Gemm/MatMul weight from its
            layer's inputs and outputs on the calibration data (``onnxq.recover.adaround``).
        adaround_steps: optimisation steps per layer.
        adaround_rows: input rows per layer that AdaRound's statistics are taken from.
        adaround_engine: ``numpy`` or ``torch`` (when installed; the same steps, same
            integers but for ties within float error).
    """

    backend: str = "tensorrt"
    method: str = "auto"
    percentile: float = 99.99
    exclude: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    max_batches: int | None = None
    fidelity_batches: int = 4
    weight_storage: str = "int8"
    weight_method: str = "mse"
    bias_correction: bool = False
    min_channels: int | None = None
    mask_threshold: float = 1e4
    concat_range_ratio: float = 8.0
    weak_channel_fraction: float = 0.25
    weak_position_fraction: float = 0.25
    reduce_range: bool | None = None
    memory_budget_mb: int = 4096
    histogram_sample: int = 65536
    histogram_budget: int = 2**24
    preprocess: str | None = None
    simplify: bool = True
    progress: bool = True
    cle: bool = False
    smoothquant: float | None = None
    calibration_mode: str = "float"
    adaround: bool = False
    adaround_steps: int = 500
    adaround_rows: int = 4096
    adaround_engine: str = "numpy"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # dict overrides and preprocess specs from Python too
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name), "config"))
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"backend: unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}"
            )
        _check_method(self.method, "method")
        if not (0.0 < float(self.percentile) <= 100.0):
            raise ConfigError(f"percentile: must be in (0, 100], got {self.percentile!r}")
        if self.weight_storage not in WEIGHT_STORAGE:
            raise ConfigError(
                f"weight_storage: got {self.weight_storage!r}; valid: {', '.join(WEIGHT_STORAGE)}"
            )
        if self.weight_method not in ("minmax", "mse"):
            raise ConfigError(f"weight_method: got {self.weight_method!r}; valid: minmax, mse")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"max_batches: must be >= 1, got {self.max_batches}")
        if self.fidelity_batches < 0:
            raise ConfigError(f"fidelity_batches: must be >= 0, got {self.fidelity_batches}")
        if not self.mask_threshold > 0:
            raise ConfigError(f"mask_threshold: must be > 0, got {self.mask_threshold}")
        if not self.concat_range_ratio >= 1:
            raise ConfigError(f"concat_range_ratio: must be >= 1, got {self.concat_range_ratio}")
        if not 0.0 < self.weak_channel_fraction <= 1.0:
            raise ConfigError(
                f"weak_channel_fraction: must be in (0, 1], got {self.weak_channel_fraction}"
            )
        if not 0.0 < self.weak_position_fraction <= 1.0:
            raise ConfigError(
                f"weak_position_fraction: must be in (0, 1], got {self.weak_position_fraction}"
            )
        if self.memory_budget_mb < 1:
            raise ConfigError(f"memory_budget_mb: must be >= 1, got {self.memory_budget_mb}")
        if self.histogram_sample < 0:
            raise ConfigError(f"histogram_sample: must be >= 0, got {self.histogram_sample}")
        if self.histogram_budget < 0:
            raise ConfigError(f"histogram_budget: must be >= 0, got {self.histogram_budget}")
        if self.min_channels is not None and self.min_channels < 0:
            raise ConfigError(f"min_channels: must be >= 0, got {self.min_channels}")
        from onnxq.recover.options import check_recovery_options

        check_recovery_options(self)
        # Normalise lists given from Python or YAML into tuples so the config stays hashable.
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "overrides", tuple(self.overrides))

    # -- queries used by the pipeline -------------------------------------------------------
    def node_excluded(self, node_name: str, op_type: str) -> str | None:
        """The pattern that keeps this node float, or ``None``."""
        for pattern in self.exclude:
            if fnmatch.fnmatchcase(node_name, pattern):
                return f"--exclude {pattern}"
        for ov in self.overrides:
            if ov.exclude and ov.matches_node(node_name, op_type):
                return f"override {_describe(ov)} exclude"
        return None

    def unmatched(self, nodes: list[tuple[str, str]], tensors: set[str]) -> list[str]:
        """The exclude patterns and overrides that match none of ``nodes`` ((name, op_type)
        pairs) and ``tensors``: a typo that would silently change nothing."""
        out = [
            f"--exclude {p!r}"
            for p in self.exclude
            if not any(fnmatch.fnmatchcase(name, p) for name, _ in nodes)
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
                out.append(f"override {_describe(ov)}")
        return out

    def tensor_excluded(self, tensor_name: str) -> str | None:
        """The override that keeps this tensor float, or ``None``."""
        for ov in self.overrides:
            if ov.exclude and ov.matches_tensor(tensor_name):
                return f"override {_describe(ov)} exclude"
        return None

    def settings_for(self, tensor_name: str, consumers: list[tuple[str, str]]) -> TensorSettings:
        """Method, bits and scheme of a tensor: overrides apply in order, field by field.

        ``consumers`` lists ``(node_name, op_type)`` of the nodes that read the tensor.
        """
        out = TensorSettings(self.method)
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
            )
        return out

    # -- (de)serialisation ------------------------------------------------------------------
    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML/JSON-ready), overrides as dicts without ``None`` fields."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "overrides":
                value = [
                    {k: v for k, v in dataclasses.asdict(o).items() if v is not None} for o in value
                ]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> QuantConfig:
        """Build from a dict, naming unknown keys and wrong types."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping of options, got {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(
                    f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(known))}"
                )
            kwargs[key] = _coerce(key, value, where)
        try:
            return cls(**kwargs)
        except ConfigError as exc:  # a value check: name the file too
            text = str(exc)
            raise ConfigError(
                text if text.startswith(f"{where}:") else f"{where}: {text}"
            ) from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> QuantConfig:
        """Load a YAML config file (safe loader: no code runs)."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}".replace("\n", " ")) from None
        from onnxq.sparsebit import from_sparsebit, is_sparsebit

        if is_sparsebit(data):  # a Sparsebit qconfig (top-level BACKEND / W / A)
            return from_sparsebit(data, where=str(p))
        return cls.from_dict(data or {}, where=str(p))

    def to_yaml(self) -> str:
        """YAML text that :meth:`from_yaml` reads back to an equal config."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)


_TYPES: dict[str, tuple[type, ...]] = {
    "backend": (str,),
    "method": (str,),
    "percentile": (int, float),
    "exclude": (list, tuple),
    "overrides": (list, tuple),
    "max_batches": (int, type(None)),
    "fidelity_batches": (int,),
    "weight_storage": (str,),
    "weight_method": (str,),
    "bias_correction": (bool,),
    "min_channels": (int, type(None)),
    "mask_threshold": (int, float),
    "concat_range_ratio": (int, float),
    "weak_channel_fraction": (int, float),
    "weak_position_fraction": (int, float),
    "reduce_range": (bool, type(None)),
    "memory_budget_mb": (int,),
    "histogram_sample": (int,),
    "histogram_budget": (int,),
    "preprocess": (str, dict, type(None)),
    "simplify": (bool,),
    "progress": (bool,),
    "cle": (bool,),
    "smoothquant": (int, float, type(None)),
    "calibration_mode": (str,),
    "adaround": (bool,),
    "adaround_steps": (int,),
    "adaround_rows": (int,),
    "adaround_engine": (str,),
}


def _coerce(key: str, value: Any, where: str) -> Any:
    expected = _TYPES[key]
    if isinstance(value, bool) and bool not in expected:
        raise ConfigError(f"{where}: {key}: expected {_names(expected)}, got a boolean")
    if not isinstance(value, expected):
        raise ConfigError(
            f"{where}: {key}: expected {_names(expected)}, got {type(value).__name__} {value!r}"
        )
    if key == "preprocess" and isinstance(value, dict):
        from onnxq.images import Preprocess

        return Preprocess.from_spec(value).to_spec()
    if key == "exclude":
        assert isinstance(value, (list, tuple))
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: exclude: expected a list of glob strings")
        return tuple(value)
    if key == "overrides":
        assert isinstance(value, (list, tuple))
        return tuple(_override(i, v, where) for i, v in enumerate(value))
    return value


def _override(index: int, value: Any, where: str) -> Override:
    if isinstance(value, Override):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: overrides[{index}]: expected a mapping")
    valid = {f.name for f in dataclasses.fields(Override)}
    for key in value:
        if key not in valid:
            raise ConfigError(
                f"{where}: overrides[{index}]: unknown key {key!r}; "
                f"valid: {', '.join(sorted(valid))}"
            )
    for key in ("node", "op_type", "tensor", "method"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise ConfigError(f"{where}: overrides[{index}].{key}: expected a string")
    for key in ("exclude", "per_channel", "symmetric"):
        if value.get(key) is not None and not isinstance(value[key], bool):
            raise ConfigError(f"{where}: overrides[{index}].{key}: expected true or false")
    bits = value.get("bits")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int)):
        raise ConfigError(f"{where}: overrides[{index}].bits: expected an integer 2..8")
    try:
        return Override(**value)
    except ConfigError as exc:
        text = str(exc).replace("overrides[].", f"overrides[{index}].")
        raise ConfigError(f"{where}: {text}") from None


def _names(types: tuple[type, ...]) -> str:
    names = {
        int: "integer",
        float: "number",
        str: "string",
        bool: "boolean",
        list: "list",
        tuple: "list",
        type(None): "null",
    }
    return " or ".join(dict.fromkeys(names[t] for t in types))


def _describe(ov: Override) -> str:
    parts = [f"{k}={getattr(ov, k)}" for k in ("node", "op_type", "tensor") if getattr(ov, k)]
    return "(" + ", ".join(parts) + ")"


__all__ = ["BACKENDS", "Override", "QuantConfig"]
