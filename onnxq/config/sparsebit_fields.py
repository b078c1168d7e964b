"""The fields of a Sparsebit qconfig section (``W`` or ``A``, or one ``SPECIFIC`` entry) as
onnxq reads them: the keys it accepts, its bit width, scheme, observer, and the refusals of the
training-time keys (:mod:`onnxq.config.sparsebit` maps them to QuantConfig options)."""

from __future__ import annotations

import re
from typing import Any

from onnxq.backends.profile import PROFILES
from onnxq.errors import ConfigError
from onnxq.numerics.qparams import WEIGHT_METHODS

OBSERVERS = {
    "MINMAX": "minmax",
    "PERCENTILE": "percentile",
    "KL_HISTOGRAM": "entropy",
    "KL": "entropy",
    "MSE": "mse",
    "ACIQ": "aciq",
    "MOVING_AVERAGE": "ema",
}
QAT_QUANTIZERS = ("lsq", "lsq+", "lsq_plus", "dorefa", "pact", "quadapter", "dq")
QAT_ADVICE = (
    "is training-time; onnxq does post-training quantization: drop the key (onnxq "
    "calibrates ranges from data), or deploy the Q/DQ ONNX that Sparsebit's QAT exports "
    "directly"
)
QAT_KEYS = (
    "QAT",
    "TRAIN",
    "TRAINING",
    "LSQ",
    "LSQ_PLUS",
    "DOREFA",
    "PACT",
    "ADAROUND",
    "REGULARIZER",
)
TOP_KEYS = ("BACKEND", "DEVICE", "SKIP_TRACE_MODULES", "SCHEDULE", "W", "A")
SCHEDULE_KEYS = ("FUSE_BN", "BN_TUNING", "DISABLE_UNNECESSARY_QUANT")
SECTION_KEYS = ("QSCHEME", "QUANTIZER", "OBSERVER", "SPECIFIC")
# Dotted keys a section (or a SPECIFIC entry) may set; anything else is an error.
LEAF_KEYS = (
    "QSCHEME",
    "QUANTIZER.TYPE",
    "QUANTIZER.BIT",
    "QUANTIZER.DISABLE",
    "QUANTIZER.TRAINING.ENABLE",
    "QUANTIZER.TRAINING.ORDER",
    "QUANTIZER.TRAINING.LR",
    "QUANTIZER.TRAINING.ITERS",
    "QUANTIZER.PACT.ALPHA_VALUE",
    "OBSERVER.TYPE",
    "OBSERVER.PERCENTILE.ALPHA",
    "OBSERVER.MOVING_AVERAGE.EMA_RATIO",
    "OBSERVER.ACIQ.DISTRIBUTION",
    "OBSERVER.LAYOUT",
)


def get_key(node: Any, key: str) -> Any:
    """``node[key]`` for a mapping, else None."""
    return node.get(key) if isinstance(node, dict) else None


def flat_keys(value: Any, prefix: str) -> dict[str, Any]:
    """Nested mapping -> ``{"QUANTIZER.BIT": 8, ...}``."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(flat_keys(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_schedule(schedule: Any, where: str) -> None:
    """Refuse an unknown ``SCHEDULE`` key and BatchNorm tuning (a training-mode step)."""
    for key, value in schedule.items() if isinstance(schedule, dict) else []:
        if key == "BN_TUNING" and value:
            raise ConfigError(
                f"{where}: SCHEDULE.BN_TUNING re-estimates BatchNorm statistics on "
                "the quantized model, a training-mode step onnxq does not run; set "
                "it false (onnxq folds BatchNorm into the conv before quantizing)"
            )
        if key not in SCHEDULE_KEYS:
            raise ConfigError(
                f"{where}: SCHEDULE: unknown key {key!r}; supported: {', '.join(SCHEDULE_KEYS)}"
            )


def read_section(section: Any, name: str, where: str) -> dict[str, Any]:
    """Section ``name`` (``W`` or ``A``) as flat keys, checked, with its ``SPECIFIC`` list."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {name}: expected a mapping")
    for key in section:
        if key not in SECTION_KEYS:
            raise ConfigError(
                f"{where}: {name}: unknown key {key!r}; supported: {', '.join(SECTION_KEYS)}"
            )
    flat = flat_keys({k: v for k, v in section.items() if k != "SPECIFIC"}, "")
    check_leaves(flat, name, where)
    flat["SPECIFIC"] = section.get("SPECIFIC") or []
    return flat


def check_leaves(flat: dict[str, Any], name: str, where: str) -> None:
    """Refuse a dotted key onnxq does not read, quantizer training and a non-uniform quantizer."""
    for key, value in flat.items():
        full = f"{name}.{key}"
        if key not in LEAF_KEYS:
            raise ConfigError(
                f"{where}: {full}: unknown Sparsebit key; supported under {name}: "
                f"{', '.join(LEAF_KEYS)}"
            )
        if key.startswith("QUANTIZER.TRAINING") and key.endswith("ENABLE") and value:
            raise ConfigError(f"{where}: {full}: quantizer training {QAT_ADVICE}")
        if key == "QUANTIZER.TYPE":
            kind = str(value).lower()
            if kind == "adaround":
                raise ConfigError(
                    f"{where}: {full}: AdaRound learns weight rounding with "
                    "gradient steps; onnxq rounds to nearest: use TYPE: uniform"
                )
            if kind in QAT_QUANTIZERS or "qat" in kind:
                raise ConfigError(f"{where}: {full}: the {value} quantizer {QAT_ADVICE}")
            if kind != "uniform":
                raise ConfigError(
                    f"{where}: {full}: unknown quantizer {value!r}; onnxq "
                    "quantizes uniformly (TYPE: uniform)"
                )


def bit_width(flat: dict[str, Any], name: str, where: str, default: int | None) -> int | None:
    """``QUANTIZER.BIT`` (2..8, 0: keep float), ``default`` when it is not set."""
    bits = flat.get("QUANTIZER.BIT", default)
    if bits is None:
        return None
    if isinstance(bits, bool) or not isinstance(bits, int) or not (bits == 0 or 2 <= bits <= 8):
        raise ConfigError(
            f"{where}: {name}.QUANTIZER.BIT: expected 2..8 (0 keeps the layer float), got {bits!r}"
        )
    return bits


def read_scheme(flat: dict[str, Any], name: str, where: str) -> tuple[str, str] | None:
    """``QSCHEME`` as (granularity, symmetry), e.g. ("channel", "symmetric"); None: not set."""
    value = flat.get("QSCHEME")
    if value is None:
        return None
    match = re.fullmatch(r"per-(tensor|channel|group)-(symmetric|affine)", str(value).lower())
    if not match:
        raise ConfigError(
            f"{where}: {name}.QSCHEME: {value!r}; valid: per-channel-symmetric, "
            "per-tensor-symmetric, per-tensor-affine"
        )
    return match.group(1), match.group(2)


def per_channel_scheme(flat: dict[str, Any], where: str, name: str = "W") -> bool | None:
    """Whether a weight ``QSCHEME`` is per channel (None: not set); only symmetric ones."""
    scheme = read_scheme(flat, name, where)
    if scheme is None:
        return None
    if scheme[1] == "affine" or scheme[0] == "group":
        raise ConfigError(
            f"{where}: {name}.QSCHEME: per-{scheme[0]}-{scheme[1]}: onnxq "
            "quantizes weights symmetrically per channel or per tensor; use "
            "per-channel-symmetric or per-tensor-symmetric"
        )
    return scheme[0] == "channel"


def symmetric_scheme(
    flat: dict[str, Any], where: str, backend: str, name: str = "A"
) -> bool | None:
    """Whether an activation ``QSCHEME`` is symmetric (None: not set); per tensor only, and
    affine only where the backend takes a zero point."""
    scheme = read_scheme(flat, name, where)
    if scheme is None:
        return None
    if scheme[0] != "tensor":
        raise ConfigError(
            f"{where}: {name}.QSCHEME: per-{scheme[0]}-{scheme[1]}: onnxq "
            "quantizes activations per tensor; use per-tensor-symmetric or "
            "per-tensor-affine"
        )
    if scheme[1] == "affine" and PROFILES[backend].activation_symmetric:
        raise ConfigError(
            f"{where}: {name}.QSCHEME: per-tensor-affine: the {backend} backend "
            "needs symmetric activations (zero point 0, as TensorRT requires); "
            "use per-tensor-symmetric or BACKEND: onnxruntime"
        )
    return scheme[1] == "symmetric"


def observer_method(flat: dict[str, Any], name: str, where: str) -> tuple[str | None, float | None]:
    """``OBSERVER.TYPE`` as an onnxq range method, and the percentile it asks for."""
    kind = flat.get("OBSERVER.TYPE")
    if kind is None:
        return None, None
    key = str(kind).upper()
    if key not in OBSERVERS:
        raise ConfigError(
            f"{where}: {name}.OBSERVER.TYPE: unknown observer {kind!r}; valid: "
            f"{', '.join(OBSERVERS)}"
        )
    if name.startswith("W") and OBSERVERS[key] not in WEIGHT_METHODS:
        raise ConfigError(
            f"{where}: {name}.OBSERVER.TYPE: {kind}: onnxq takes per-channel weight "
            "ranges by MINMAX or MSE (weight_method); use one of those"
        )
    if key != "PERCENTILE":
        return OBSERVERS[key], None
    alpha = flat.get("OBSERVER.PERCENTILE.ALPHA", 0.001)  # Sparsebit's default
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1:
        raise ConfigError(
            f"{where}: {name}.OBSERVER.PERCENTILE.ALPHA: expected a fraction in "
            f"[0, 1), got {alpha!r}"
        )
    return "percentile", round(100.0 * (1.0 - float(alpha)), 10)
