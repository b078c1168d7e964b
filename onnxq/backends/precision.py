"""The profile of one run: the backend's profile with its precision's (or ``--dynamic``'s) fields,
or a one-line refusal when the backend cannot run what the config asks for.

Everything here reads profile data (``precisions``, ``precision_refusals``, ``dynamic_changes``);
nothing branches on a backend's name.  A refusal is raised before anything is loaded or written.
"""

from __future__ import annotations

from onnxq.backends.profile import BackendProfile
from onnxq.config import QuantConfig
from onnxq.errors import ConfigError
from onnxq.precisions import PRECISIONS


def used_precisions(config: QuantConfig) -> list[str]:
    """The precisions a config names: the run's, then its overrides' (each once)."""
    names = [config.precision, *(ov.precision for ov in config.overrides if ov.precision)]
    return list(dict.fromkeys(names))


def run_profile(profile: BackendProfile, config: QuantConfig) -> BackendProfile:
    """``profile`` changed for ``config.precision`` (or ``config.dynamic``); a
    :class:`ConfigError` when the backend cannot run a precision the config names."""
    for name in used_precisions(config):
        if name not in profile.precisions:
            why = profile.precision_refusals.get(
                name, f"{profile.name} has no {PRECISIONS[name].summary} kernels"
            )
            raise ConfigError(f"precision {name} with --backend {profile.name}: {why}")
    if config.dynamic:
        if profile.dynamic_changes is None:
            raise ConfigError(f"--dynamic with --backend {profile.name}: {profile.dynamic_refusal}")
        if config.bias_correction:
            raise ConfigError(
                "bias_correction corrects the rounding of static quantization; --dynamic "
                "quantizes activations at run time: drop one of them"
            )
        if used_precisions(config) != ["int8"]:
            raise ConfigError(
                "--dynamic quantizes to int8 only (onnxruntime's dynamic kernels take 8-bit "
                "inputs): drop precision "
                + ", ".join(p for p in used_precisions(config) if p != "int8")
            )
        return profile.replace(**profile.dynamic_changes)
    changes = profile.precisions[config.precision]
    profile = profile.replace(**changes) if changes else profile
    # a precision an override names needs its opset too (FP8 Q/DQ: 19)
    opsets = [
        int(profile.precisions[name].get("min_opset", profile.min_opset))  # type: ignore[call-overload]
        for name in used_precisions(config)
    ]
    return profile.replace(min_opset=max(profile.min_opset, *opsets))
