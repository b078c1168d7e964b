"""Conv shapes a backend's quantized kernels do not take, from the profile's data.

TensorRT's FP8 conv kernels (ModelOpt's FP8 placement, docs/precisions.md) take filters of at
most 32 elements and more than 16 input channels per group and output channels; outside that an
FP8 conv runs slower than in FP16, so it stays float.
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
