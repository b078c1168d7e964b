"""Read a Sparsebit qconfig (megvii-research/Sparsebit ``qconfig.yaml``) as QuantConfig options
(``QuantConfig.from_sparsebit``, and ``QuantConfig.from_yaml`` on such a file).

Sparsebit's format (``sparsebit/quantization/quant_config.py``)::

    BACKEND: tensorrt                       # tensorrt | onnxruntime (| virtual: rejected)
    SKIP_TRACE_MODULES: ["head*"]           # module names kept float -> exclude
    SCHEDULE: {FUSE_BN: true}               # accepted (onnxq folds BN itself)
    W:
      QSCHEME: per-channel-symmetric        # -> per_channel on Conv/ConvTranspose/Gemm/MatMul
      QUANTIZER: {TYPE: uniform, BIT: 8}    # BIT -> Override.bits (2..8; 0 = keep float)
      OBSERVER: {TYPE: MINMAX}              # -> weight_method (MINMAX or MSE)
      SPECIFIC: [{"layer1_0_conv1": ["QUANTIZER.BIT", 4]}]
    A:
      QSCHEME: per-tensor-symmetric         # -> symmetric activations
      QUANTIZER: {TYPE: uniform, BIT: 8}
      OBSERVER: {TYPE: PERCENTILE, PERCENTILE: {ALPHA: 0.001}, LAYOUT: NCHW}
      SPECIFIC: [{"*ln*": ["QUANTIZER.DISABLE", true]}]

Mapping rules (docs/config.md has the full table):

* ``A.OBSERVER.TYPE`` -> ``method``: MINMAX minmax, PERCENTILE percentile (``percentile =
  100 * (1 - ALPHA)``), KL_HISTOGRAM/KL entropy, MSE mse, ACIQ aciq, MOVING_AVERAGE ema.
* ``SPECIFIC`` keys are torch.fx node names (``layer1_0_conv1``); each becomes the node glob
  ``*/layer1[._/]0[._/]conv1/*``, which matches the TorchScript exporter's scope
  ``/layer1/layer1.0/conv1/`` at any depth.  A key containing ``/`` is used as an ONNX node glob
  as is (write ``*/Softmax*`` for functional ops, which have no module scope).
* onnxq gives an op one bit width for its weight and its inputs, so global ``W`` and ``A`` BITs
  must agree; for SPECIFIC entries, A entries are applied after W entries and win.  Sparsebit
  applies only the first matching SPECIFIC pattern; onnxq emits the entries in reverse order so
  the first wins for every key it sets (keys set only by later matching entries also apply).
* Training-time features (QAT quantizers, TRAINING, REGULARIZER, BN_TUNING, AdaRound) have no
  post-training equivalent: :class:`~onnxq.errors.ConfigError` says what to do instead.
"""

from __future__ import annotations

import re
from typing import Any

from onnxq.backends.profile import BACKENDS, PROFILES
from onnxq.config.overrides import Override
from onnxq.config.scopes import module_pattern
from onnxq.errors import ConfigError
from onnxq.numerics.qparams import WEIGHT_METHODS

WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
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
_QAT = (
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


def is_sparsebit(doc: Any) -> bool:
    """True for a Sparsebit qconfig: a mapping with a top-level ``BACKEND``, ``W`` or ``A``."""
    return isinstance(doc, dict) and any(k in doc for k in ("BACKEND", "W", "A"))


def sparsebit_options(doc: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """Map a Sparsebit qconfig (the parsed YAML mapping) to the :class:`~onnxq.QuantConfig`
    fields it sets (``QuantConfig.from_sparsebit`` builds the config).

    Raises:
        ConfigError: a key or value with no onnxq equivalent; the message names the key and
            says what to do instead.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a Sparsebit qconfig mapping")
    for key in doc:
        if key in QAT_KEYS:
            if key == "REGULARIZER" and not _get(doc[key], "ENABLE"):
                continue
            raise ConfigError(f"{where}: {key}: {key} {_QAT}")
        if key == "SPECIFIC":
            raise ConfigError(
                f"{where}: SPECIFIC: Sparsebit reads SPECIFIC under W: and A:, "
                "not at the top level; move it there"
            )
        if key not in TOP_KEYS:
            raise ConfigError(
                f"{where}: unknown Sparsebit key {key!r}; supported: {', '.join(TOP_KEYS)}"
            )
    backend = str(doc.get("BACKEND", "tensorrt")).lower()
    if backend not in BACKENDS:
        raise ConfigError(
            f"{where}: BACKEND: {doc.get('BACKEND')!r} is not an onnxq backend; "
            f"valid: {', '.join(BACKENDS)} (Sparsebit's 'virtual' simulates low "
            "bit widths; onnxq narrows int8 storage with QUANTIZER.BIT instead)"
        )
    _schedule(doc.get("SCHEDULE") or {}, where)
    w = _section(doc.get("W") or {}, "W", where)
    a = _section(doc.get("A") or {}, "A", where)
    w_bits, a_bits = _bits(w, "W", where, 8), _bits(a, "A", where, 8)
    if w_bits != a_bits:
        raise ConfigError(
            f"{where}: W.QUANTIZER.BIT={w_bits} and A.QUANTIZER.BIT={a_bits}: onnxq "
            "gives an op one bit width for its weight and inputs; set both to the "
            "same value and use SPECIFIC entries for single layers"
        )
    if w_bits == 0 or w.get("QUANTIZER.DISABLE") or a.get("QUANTIZER.DISABLE"):
        raise ConfigError(
            f"{where}: QUANTIZER: BIT 0 / DISABLE at the top of W or A turns "
            "quantization off everywhere; there is nothing to quantize"
        )
    overrides: list[Override] = []
    if w_bits != 8:
        overrides.append(Override(node="*", bits=w_bits))
    if _per_channel(w, where) is False:
        overrides += [Override(op_type=op, per_channel=False) for op in WEIGHT_OPS]
    symmetric = _symmetric(a, where, backend)
    if symmetric is True and not PROFILES[backend].activation_symmetric:
        overrides.append(Override(node="*", symmetric=True))
    method, percentile = _observer(a, "A", where)
    weight_method = _observer(w, "W", where)[0] or "minmax"  # Sparsebit's default observer
    percentiles: set[float] = set() if percentile is None else {percentile}
    for name, section in (("W", w), ("A", a)):
        specific = [
            _specific(pattern, entry, name, where, backend, weight_method)
            for pattern, entry in _entries(section, name, where)
        ]
        overrides += reversed([ov for ov, _ in specific if ov is not None])
        percentiles |= {value for _, value in specific if value is not None}
    if len(percentiles) > 1:
        raise ConfigError(
            f"{where}: A: OBSERVER.PERCENTILE.ALPHA differs between A and its "
            f"SPECIFIC entries (percentiles {sorted(percentiles)}); onnxq has one "
            "percentile for the whole model"
        )
    percentile = next(iter(percentiles), None)
    exclude = tuple(module_pattern(str(m)) for m in doc.get("SKIP_TRACE_MODULES") or [])
    options: dict[str, Any] = {
        "backend": backend,
        "method": method or "minmax",
        "weight_method": weight_method,
        "exclude": exclude,
        "overrides": tuple(overrides),
    }
    if percentile is not None:
        options["percentile"] = percentile
    return options


def name_glob(pattern: str) -> str:
    """Node glob for a Sparsebit (torch.fx) module-name pattern; ``/`` means an ONNX glob."""
    if "/" in pattern:
        return pattern
    return "*/" + re.sub(r"[._]", "[._/]", pattern) + "/*"


def _get(node: Any, key: str) -> Any:
    return node.get(key) if isinstance(node, dict) else None


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    """Nested mapping -> ``{"QUANTIZER.BIT": 8, ...}``."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _schedule(schedule: Any, where: str) -> None:
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


def _section(section: Any, name: str, where: str) -> dict[str, Any]:
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {name}: expected a mapping")
    for key in section:
        if key not in SECTION_KEYS:
            raise ConfigError(
                f"{where}: {name}: unknown key {key!r}; supported: {', '.join(SECTION_KEYS)}"
            )
    flat = _flat({k: v for k, v in section.items() if k != "SPECIFIC"}, "")
    _check_leaves(flat, name, where)
    flat["SPECIFIC"] = section.get("SPECIFIC") or []
    return flat


def _check_leaves(flat: dict[str, Any], name: str, where: str) -> None:
    for key, value in flat.items():
        full = f"{name}.{key}"
        if key not in LEAF_KEYS:
            raise ConfigError(
                f"{where}: {full}: unknown Sparsebit key; supported under {name}: "
                f"{', '.join(LEAF_KEYS)}"
            )
        if key.startswith("QUANTIZER.TRAINING") and key.endswith("ENABLE") and value:
            raise ConfigError(f"{where}: {full}: quantizer training {_QAT}")
        if key == "QUANTIZER.TYPE":
            kind = str(value).lower()
            if kind == "adaround":
                raise ConfigError(
                    f"{where}: {full}: AdaRound learns weight rounding with "
                    "gradient steps; onnxq rounds to nearest: use TYPE: uniform"
                )
            if kind in QAT_QUANTIZERS or "qat" in kind:
                raise ConfigError(f"{where}: {full}: the {value} quantizer {_QAT}")
            if kind != "uniform":
                raise ConfigError(
                    f"{where}: {full}: unknown quantizer {value!r}; onnxq "
                    "quantizes uniformly (TYPE: uniform)"
                )


def _bits(flat: dict[str, Any], name: str, where: str, default: int | None) -> int | None:
    bits = flat.get("QUANTIZER.BIT", default)
    if bits is None:
        return None
    if isinstance(bits, bool) or not isinstance(bits, int) or not (bits == 0 or 2 <= bits <= 8):
        raise ConfigError(
            f"{where}: {name}.QUANTIZER.BIT: expected 2..8 (0 keeps the layer float), got {bits!r}"
        )
    return bits


def _scheme(flat: dict[str, Any], name: str, where: str) -> tuple[str, str] | None:
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


def _per_channel(flat: dict[str, Any], where: str, name: str = "W") -> bool | None:
    scheme = _scheme(flat, name, where)
    if scheme is None:
        return None
    if scheme[1] == "affine" or scheme[0] == "group":
        raise ConfigError(
            f"{where}: {name}.QSCHEME: per-{scheme[0]}-{scheme[1]}: onnxq "
            "quantizes weights symmetrically per channel or per tensor; use "
            "per-channel-symmetric or per-tensor-symmetric"
        )
    return scheme[0] == "channel"


def _symmetric(flat: dict[str, Any], where: str, backend: str, name: str = "A") -> bool | None:
    scheme = _scheme(flat, name, where)
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


def _observer(flat: dict[str, Any], name: str, where: str) -> tuple[str | None, float | None]:
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


def _entries(section: dict[str, Any], name: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """SPECIFIC: ``[{pattern: [KEY, value, ...] or {nested}}, ...]`` -> (pattern, flat keys)."""
    specific = section["SPECIFIC"]
    if isinstance(specific, dict):
        specific = [specific]
    if not isinstance(specific, list) or not all(isinstance(d, dict) for d in specific):
        raise ConfigError(
            f"{where}: {name}.SPECIFIC: expected a list of mappings "
            "[{module_pattern: [KEY, value, ...]}]"
        )
    out = []
    for mapping in specific:
        for pattern, value in mapping.items():
            label = f"{name}.SPECIFIC[{pattern!r}]"
            if isinstance(value, list):
                if len(value) % 2:
                    raise ConfigError(f"{where}: {label}: expected KEY, value pairs, got {value}")
                flat = {str(k): v for k, v in zip(value[::2], value[1::2], strict=True)}
            elif isinstance(value, dict):
                flat = _flat(value, "")
            else:
                raise ConfigError(f"{where}: {label}: expected [KEY, value, ...]")
            _check_leaves(flat, label, where)
            out.append((str(pattern), flat))
    return out


def _specific(
    pattern: str, flat: dict[str, Any], name: str, where: str, backend: str, weight_method: str
) -> tuple[Override | None, float | None]:
    """One SPECIFIC entry -> an Override (``None`` if it sets nothing onnxq maps) and the
    percentile it asks for."""
    label = f"{name}.SPECIFIC[{pattern!r}]"
    bits = _bits(flat, label, where, None)
    node = name_glob(pattern)
    if bits == 0 or flat.get("QUANTIZER.DISABLE"):
        return Override(node=node, exclude=True), None
    fields: dict[str, Any] = {"bits": bits}
    method = percentile = None
    if name == "W":
        if _observer(flat, label, where)[0] not in (None, weight_method):
            raise ConfigError(
                f"{where}: {label}: OBSERVER.TYPE: onnxq has one weight observer "
                "for the whole model (weight_method); set it in W.OBSERVER"
            )
        fields["per_channel"] = _per_channel(flat, where, label)
    else:
        fields["symmetric"] = _symmetric(flat, where, backend, label)
        method, percentile = _observer(flat, label, where)
        fields["method"] = method
    fields = {k: v for k, v in fields.items() if v is not None}
    return (Override(node=node, **fields) if fields else None), percentile


__all__ = ["is_sparsebit", "name_glob", "sparsebit_options"]
