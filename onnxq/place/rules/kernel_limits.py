"""Conv shapes a backend's quantized kernels do not take, from the profile's data.

TensorRT's FP8 conv kernels (ModelOpt's FP8 placement, docs/precisions.md) take filters of at
most 32 elements and more than 16 input channels per group and output channels; outside that an
FP8 conv runs slower than in FP16, so it stays float.

The small-op rule (``min_channels``) has one exception for Convs, judged by the GEMM a
convolution runs as (CUTLASS's "Implicit GEMM Convolution": GEMM_K = C x R x S): a group-1
Conv that sums at least ``long_conv_reduction`` products per output takes INT8 whatever its
channel counts (:func:`conv_reduction`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from onnxq.backends.profile import BackendProfile
from onnxq.place.rules.pattern import Decline


def conv_kernel_decline(profile: BackendProfile, shape: tuple[int, ...]) -> Decline | None:
    """Why a Conv whose weight has ``shape`` ([K, C/group, kh, kw...]) stays float on
    ``profile``, or None."""
    area = math.prod(int(d) for d in shape[2:])
    if profile.max_conv_kernel_area and area > profile.max_conv_kernel_area:
        return Decline(
            f"its filter has {area} elements per channel (> {profile.max_conv_kernel_area}): "
            f"{profile.name}'s kernels in this precision do not take it, it stays float"
        )
    out_c, in_c = int(shape[0]), int(shape[1])
    limit = profile.min_conv_channels
    if limit and (out_c <= limit or in_c <= limit):
        return Decline(
            f"Conv with {in_c} input channels per group / {out_c} output channels (<= {limit} "
            f"on either side): {profile.name}'s kernels in this precision run it slower than "
            "in float16, it stays float"
        )
    return None


def conv_reduction(shape: tuple[int, ...]) -> int:
    """K of the implicit GEMM of a Conv whose weight has ``shape`` ([N, C/group, kh, kw...]):
    the products summed per output, input channels per group x kernel area."""
    return int(shape[1]) * math.prod(int(d) for d in shape[2:])


def long_reduction(profile: BackendProfile, shape: tuple[int, ...], group: int) -> int | None:
    """K (:func:`conv_reduction`) where it exempts a Conv from the small-op rule on
    ``profile`` (a group-1 Conv with K >= ``profile.long_conv_reduction``), else None."""
    if group != 1 or not profile.long_conv_reduction:
        return None
    k = conv_reduction(shape)
    return k if k >= profile.long_conv_reduction else None


def pool_overhang_decline(
    attrs: Mapping[str, Any], shape: tuple[int | str | None, ...] | None
) -> Decline | None:
    """Why an AveragePool stays float as an integer kernel, or None.

    With ``ceil_mode=1`` and ``count_include_pad=1``, a window that runs past the padded input
    (the extra output that ceil mode adds) averages over its in-bounds part in float
    (PyTorch's and onnxruntime's AveragePool), but onnxruntime 1.32's QLinearAveragePool
    divides it by the whole kernel: ``nn.AvgPool2d(k, ceil_mode=True)`` (HF EfficientNet's
    pooler: a kernel larger than its input) came out near zero.  A window that stays inside
    never differs, so the pool stays float only where the input's static shape shows an
    overhang or cannot show there is none.
    """
    if not attrs.get("ceil_mode") or not attrs.get("count_include_pad"):
        return None
    kernel = [int(k) for k in attrs.get("kernel_shape", ())]
    strides = [int(s) for s in attrs.get("strides", ())] or [1] * len(kernel)
    pads = [int(p) for p in attrs.get("pads", ())] or [0] * (2 * len(kernel))
    spatial = list(shape[2:]) if shape is not None else []
    sizes = [d for d in spatial if isinstance(d, int)]
    n = len(kernel)
    if len(sizes) == len(spatial) == n and all(
        (d + pads[i] + pads[i + n] - kernel[i]) % strides[i] == 0 for i, d in enumerate(sizes)
    ):
        return None
    return Decline(
        "AveragePool with ceil_mode=1 and count_include_pad=1 on an input whose last window "
        "overhangs it (or whose size is unknown): onnxruntime's QLinearAveragePool divides "
        "such a window by the whole kernel where the float op averages its in-bounds part, "
        "so it stays float"
    )
