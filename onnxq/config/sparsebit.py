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
from onnxq.config.sparsebit_fields import (
    QAT_ADVICE,
    QAT_KEYS,
    TOP_KEYS,
    bit_width,
    check_leaves,
    check_schedule,
    flat_keys,
    get_key,
    observer_method,
    per_channel_scheme,
    read_section,
    symmetric_scheme,
)
from onnxq.errors import ConfigError
from onnxq.ir.ops import WEIGHTED_OP_TYPES


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
    _check_top_keys(doc, where)
    backend = _backend(doc, where)
    check_schedule(doc.get("SCHEDULE") or {}, where)
    w = read_section(doc.get("W") or {}, "W", where)
    a = read_section(doc.get("A") or {}, "A", where)
    bits = _shared_bit_width(w, a, where)
    overrides: list[Override] = []
    if bits != 8:
        overrides.append(Override(node="*", bits=bits))
    if per_channel_scheme(w, where) is False:
        overrides += [Override(op_type=op, per_channel=False) for op in WEIGHTED_OP_TYPES]
    symmetric = symmetric_scheme(a, where, backend)
    if symmetric is True and not PROFILES[backend].activation_symmetric:
        overrides.append(Override(node="*", symmetric=True))
    method, percentile = observer_method(a, "A", where)
    weight_method = observer_method(w, "W", where)[0] or "minmax"  # Sparsebit's default observer
    specific, percentile = _specific_overrides(w, a, where, backend, weight_method, percentile)
    exclude = tuple(module_pattern(str(m)) for m in doc.get("SKIP_TRACE_MODULES") or [])
    options: dict[str, Any] = {
        "backend": backend,
        "method": method or "minmax",
        "weight_method": weight_method,
        "exclude": exclude,
        "overrides": tuple(overrides + specific),
    }
    if percentile is not None:
        options["percentile"] = percentile
    return options


def _check_top_keys(doc: dict[str, Any], where: str) -> None:
    """Refuse the top-level keys onnxq has no equivalent for (QAT, a misplaced SPECIFIC)."""
    for key in doc:
        if key in QAT_KEYS:
            if key == "REGULARIZER" and not get_key(doc[key], "ENABLE"):
                continue
            raise ConfigError(f"{where}: {key}: {key} {QAT_ADVICE}")
        if key == "SPECIFIC":
            raise ConfigError(
                f"{where}: SPECIFIC: Sparsebit reads SPECIFIC under W: and A:, "
                "not at the top level; move it there"
            )
        if key not in TOP_KEYS:
            raise ConfigError(
                f"{where}: unknown Sparsebit key {key!r}; supported: {', '.join(TOP_KEYS)}"
            )


def _backend(doc: dict[str, Any], where: str) -> str:
    """The onnxq backend ``BACKEND`` names (default tensorrt)."""
    backend = str(doc.get("BACKEND", "tensorrt")).lower()
    if backend not in BACKENDS:
        raise ConfigError(
            f"{where}: BACKEND: {doc.get('BACKEND')!r} is not an onnxq backend; "
            f"valid: {', '.join(BACKENDS)} (Sparsebit's 'virtual' simulates low "
            "bit widths; onnxq narrows int8 storage with QUANTIZER.BIT instead)"
        )
    return backend


def _shared_bit_width(w: dict[str, Any], a: dict[str, Any], where: str) -> int | None:
    """The one bit width W and A share (onnxq gives an op one width for weight and inputs)."""
    w_bits, a_bits = bit_width(w, "W", where, 8), bit_width(a, "A", where, 8)
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
    return w_bits


def _specific_overrides(
    w: dict[str, Any],
    a: dict[str, Any],
    where: str,
    backend: str,
    weight_method: str,
    percentile: float | None,
) -> tuple[list[Override], float | None]:
    """The overrides of the W and A ``SPECIFIC`` entries (a later entry first: it wins), and
    the one percentile of A and its entries."""
    overrides: list[Override] = []
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
    return overrides, next(iter(percentiles), None)


def name_glob(pattern: str) -> str:
    """Node glob for a Sparsebit (torch.fx) module-name pattern; ``/`` means an ONNX glob."""
    if "/" in pattern:
        return pattern
    return "*/" + re.sub(r"[._]", "[._/]", pattern) + "/*"


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
                flat = flat_keys(value, "")
            else:
                raise ConfigError(f"{where}: {label}: expected [KEY, value, ...]")
            check_leaves(flat, label, where)
            out.append((str(pattern), flat))
    return out


def _specific(
    pattern: str, flat: dict[str, Any], name: str, where: str, backend: str, weight_method: str
) -> tuple[Override | None, float | None]:
    """One SPECIFIC entry -> an Override (``None`` if it sets nothing onnxq maps) and the
    percentile it asks for."""
    label = f"{name}.SPECIFIC[{pattern!r}]"
    bits = bit_width(flat, label, where, None)
    node = name_glob(pattern)
    if bits == 0 or flat.get("QUANTIZER.DISABLE"):
        return Override(node=node, exclude=True), None
    fields: dict[str, Any] = {"bits": bits}
    method = percentile = None
    if name == "W":
        if observer_method(flat, label, where)[0] not in (None, weight_method):
            raise ConfigError(
                f"{where}: {label}: OBSERVER.TYPE: onnxq has one weight observer "
                "for the whole model (weight_method); set it in W.OBSERVER"
            )
        fields["per_channel"] = per_channel_scheme(flat, where, label)
    else:
        fields["symmetric"] = symmetric_scheme(flat, where, backend, label)
        method, percentile = observer_method(flat, label, where)
        fields["method"] = method
    fields = {k: v for k, v in fields.items() if v is not None}
    return (Override(node=node, **fields) if fields else None), percentile


__all__ = ["is_sparsebit", "name_glob", "sparsebit_options"]
