"""The recovery section: the accuracy-recovery steps (``onnxq.recover``): the float rewrites
(equalization, SmoothQuant), prefix calibration, AdaRound and its modes, the corrections and
the range search; with the values each field allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxq.config.fields import Section, must, one_of, option
from onnxq.errors import ConfigError

CALIBRATION_MODES = ("float", "prefix")
ADAROUND_ENGINES = ("numpy", "torch")
ADAROUND_MODES = ("float", "sequential", "block")


def check_engine(name: str, value: Any) -> None:
    """Raise :class:`ConfigError` for an unknown AdaRound engine, or torch when it is not
    installed."""
    if value not in ADAROUND_ENGINES:
        raise ConfigError(f"{name}: unknown engine {value!r}; valid: {', '.join(ADAROUND_ENGINES)}")
    if value == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"{name}: torch is not installed; pip install torch, or use numpy"
            ) from None


@dataclass(frozen=True)
class RecoveryOptions(Section):
    """Which accuracy-recovery algorithms run, and their effort.

    Attributes:
        cle: cross-layer equalization of Conv -> (Relu | LeakyRelu | PRelu | nothing) ->
            Conv pairs before calibration (an exact float rewrite; ``onnxq.recover.cle``).
        dw_equalization: for Conv -> (Relu | LeakyRelu | PRelu | Clip(0, hi) | nothing) ->
            depthwise Conv, scale the channels between them up to one range, each by at most
            this factor (weights quantized per channel do not change;
            ``onnxq.recover.dwequal``); ``0``: off.
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
        bias_correction: subtract from each quantized Conv/ConvTranspose/Gemm/MatMul layer's
            float bias the mean output shift its weight rounding causes, measured per channel
            on the calibration data (one extra pass; ``onnxq.recover.bias_correction``).
    """

    cle: bool = option(False)
    dw_equalization: float = option(0.0, must(lambda v: v == 0 or v >= 1, "be 0 (off) or >= 1"))
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
    bias_correction: bool = option(False)


__all__ = [
    "ADAROUND_ENGINES",
    "ADAROUND_MODES",
    "CALIBRATION_MODES",
    "RecoveryOptions",
    "check_engine",
]
