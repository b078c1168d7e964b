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

from onnxq.backends.profile import BackendProfile
from onnxq.rewrites.pattern import Decline


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
