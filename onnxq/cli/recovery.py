"""The accuracy-recovery flags of ``onnxq quantize`` and the QuantConfig fields they set."""

from __future__ import annotations

import argparse
from typing import Any

from onnxq.config.recovery import ADAROUND_ENGINES, ADAROUND_MODES, CALIBRATION_MODES
from onnxq.recover.dwequal import DEFAULT_MAX_SCALE
from onnxq.recover.smoothquant import DEFAULT_ALPHA


def add_recovery_flags(
    r: argparse._ActionsContainer, placement: argparse._ActionsContainer
) -> None:
    """Add the accuracy-recovery options to ``r`` (``quantize``'s recovery section;
    docs/accuracy.md), and --shift-activations, a placement field, to ``placement``."""
    on_off = argparse.BooleanOptionalAction
    r.add_argument(
        "--cle",
        action=on_off,
        help="cross-layer equalization of Conv -> [Relu] -> Conv pairs (exact float rewrite; "
        "a Clip between them leaves the pair alone)",
    )
    r.add_argument(
        "--dw-equalization",
        type=float,
        nargs="?",
        const=DEFAULT_MAX_SCALE,
        metavar="MAX_SCALE",
        help="give the channels of each activation a depthwise Conv reads one range, scaling "
        "the Conv before it (weights quantized per channel do not change); channels are "
        f"scaled up by at most MAX_SCALE (default {DEFAULT_MAX_SCALE:g})",
    )
    placement.add_argument(
        "--shift-activations",
        action=on_off,
        help="tensorrt: quantize each non-negative activation that only Conv/Gemm layers read "
        "(a Relu/ReLU6 output) shifted down by half its range, on the whole int8 grid (twice "
        "the steps), and add the shift back through the readers' biases (exact in float; a "
        "padded reader gets a Pad before the QuantizeLinear)",
    )
    r.add_argument(
        "--smoothquant",
        type=float,
        nargs="?",
        const=DEFAULT_ALPHA,
        metavar="ALPHA",
        help="migrate the outlier channels of MatMul/Gemm inputs into the weights with "
        f"strength ALPHA in (0, 1] (exact float rewrite; on by default, alpha {DEFAULT_ALPHA})",
    )
    r.add_argument(
        "--no-smoothquant",
        dest="smoothquant",
        action="store_const",
        const=0.0,
        help="turn SmoothQuant off (the same as --smoothquant 0)",
    )
    _reconstruction_flags(r)


def _reconstruction_flags(r: argparse._ActionsContainer) -> None:
    """The recovery options that need the statistics: prefix calibration, AdaRound, the
    corrections and the range search."""
    on_off = argparse.BooleanOptionalAction
    r.add_argument(
        "--calibration-mode",
        choices=CALIBRATION_MODES,
        help="float: ranges from the float model; prefix: measured again with every earlier "
        "layer quantized (two more passes)",
    )
    r.add_argument(
        "--adaround",
        action=on_off,
        help="learn each Conv/Gemm/MatMul weight's rounding from its layer's inputs and "
        "outputs on the calibration data",
    )
    r.add_argument(
        "--adaround-mode",
        choices=ADAROUND_MODES,
        help="float: fit each layer on the float model's inputs (one pass); sequential: "
        "layer by layer on its inputs with every earlier layer quantized and rounded, against "
        "the float output, kept where the model's output error drops (about three passes "
        "per layer); block: the layers of each block of Convs learned together against the "
        "block's float output, on the quantized prefix, kept where the model's output error "
        "drops; implies --adaround",
    )
    r.add_argument(
        "--adaround-engine",
        choices=ADAROUND_ENGINES,
        help="what AdaRound's optimisation runs on: numpy (default) or torch (when installed; "
        "the same steps, faster)",
    )
    r.add_argument(
        "--sequential-correction",
        action=on_off,
        help="remove each layer's mean output shift from its bias, measured layer by layer "
        "with every earlier layer quantized, where that lowers the output error (about two "
        "passes over the data per layer)",
    )
    r.add_argument(
        "--range-search",
        action=on_off,
        help="choose each activation's clip range, one tensor at a time in graph order, by "
        "the model's output error among the observer's range scaled by 1.2, 1, 0.9, ..., 0.5 "
        "and the mse range (about 1 + candidates/2 passes over the data per tensor)",
    )
    r.add_argument(
        "--bias-correction",
        action=on_off,
        help="subtract each layer's mean output shift from weight rounding from its bias",
    )


def recovery_options(args: argparse.Namespace) -> dict[str, Any]:
    """QuantConfig fields the recovery flags set (None: not given, the config decides)."""
    return {
        "cle": args.cle,
        "dw_equalization": args.dw_equalization,
        "shift_activations": args.shift_activations,
        "smoothquant": args.smoothquant,
        "calibration_mode": args.calibration_mode,
        "adaround": True if args.adaround is None and args.adaround_mode else args.adaround,
        "adaround_mode": args.adaround_mode,
        "adaround_engine": args.adaround_engine,
        "bias_correction": args.bias_correction,
        "sequential_correction": args.sequential_correction,
        "range_search": args.range_search,
    }
