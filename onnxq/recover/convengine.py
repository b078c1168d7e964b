"""2-D convolution forward and backward for block reconstruction, in numpy and in torch.

:mod:`onnxq.recover.blockprogram` runs a block of Convs forward and its gradient backward by
hand, so that the same steps run on numpy arrays or torch tensors.  The only op that differs is
the convolution: :class:`NumpyConv` computes it as a matrix product over the input's patches
(im2col; grouped and depthwise Convs group by group) and its input gradient by adding the
patches' gradients back (col2im); :class:`TorchConv` calls torch's own kernels.  Both take the
input already padded (``pad``) and return the padded input's gradient, so asymmetric ONNX pads
need no special case.  Results agree within float32 rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ConvGeometry:
    """One Conv's attributes: ``pads`` as ONNX writes them (begins then ends)."""

    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    group: int


class NumpyConv:
    """Convolution on numpy arrays (float32), the reference engine."""

    name = "numpy"
    xp: Any = np

    def array(self, value: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(value, dtype=np.float32)

    def numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def pad(self, x: np.ndarray, g: ConvGeometry) -> np.ndarray:
        top, left, bottom, right = g.pads
        if not any(g.pads):
            return x
        return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))

    def crop(self, grad: np.ndarray, g: ConvGeometry) -> np.ndarray:
        top, left, bottom, right = g.pads
        h, w = grad.shape[2], grad.shape[3]
        return grad[:, :, top : h - bottom, left : w - right]

    def _patches(self, xp: np.ndarray, kernel: tuple[int, int], g: ConvGeometry) -> np.ndarray:
        """``[N, G, OH * OW, Cg * kh * kw]`` patches of the padded input."""
        kh, kw = kernel
        (sh, sw), (dh, dw) = g.strides, g.dilations
        span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
        win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(2, 3))
        win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, OH, OW, kh, kw]
        n, c, oh, ow = win.shape[:4]
        win = win.reshape(n, g.group, c // g.group, oh, ow, kh, kw)
        return win.transpose(0, 1, 3, 4, 2, 5, 6).reshape(n, g.group, oh * ow, -1)

    def forward(self, xp: np.ndarray, weight: np.ndarray, g: ConvGeometry) -> np.ndarray:
        """Conv of the padded input ``xp`` with ``weight`` ``[O, Cg, kh, kw]``, no bias."""
        o, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
        cols = self._patches(xp, (kh, kw), g)
        w = weight.reshape(g.group, o // g.group, -1)
        out = np.matmul(w[None], cols.transpose(0, 1, 3, 2))  # [N, G, Og, P]
        oh = (xp.shape[2] - (kh - 1) * g.dilations[0] - 1) // g.strides[0] + 1
        ow = (xp.shape[3] - (kw - 1) * g.dilations[1] - 1) // g.strides[1] + 1
        return out.reshape(xp.shape[0], o, oh, ow)

    def backward(
        self, xp: np.ndarray, weight: np.ndarray, grad: np.ndarray, g: ConvGeometry, need_x: bool
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Gradients of the padded input (None unless ``need_x``) and of the weight."""
        o, cg, kh, kw = weight.shape
        n = xp.shape[0]
        cols = self._patches(xp, (kh, kw), g)
        dy = grad.reshape(n, g.group, o // g.group, -1)  # [N, G, Og, P]
        dw = np.einsum("ngop,ngpk->gok", dy, cols, optimize=True).reshape(weight.shape)
        if not need_x:
            return None, dw
        w = weight.reshape(g.group, o // g.group, -1)
        dcols = np.matmul(dy.transpose(0, 1, 3, 2), w[None])  # [N, G, P, Cg*kh*kw]
        oh, ow = grad.shape[2], grad.shape[3]
        dcols = dcols.reshape(n, g.group, oh, ow, cg, kh, kw)
        dx = np.zeros_like(xp)
        (sh, sw), (dh, dw_) = g.strides, g.dilations
        for i in range(kh):
            for j in range(kw):
                part = dcols[:, :, :, :, :, i, j].transpose(0, 1, 4, 2, 3)
                rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
                cols_ = slice(j * dw_, j * dw_ + sw * (ow - 1) + 1, sw)
                dx[:, :, rows, cols_] += part.reshape(n, g.group * cg, oh, ow)
        return dx, dw


class TorchConv(NumpyConv):
    """Convolution with torch's kernels (CPU, float32); the same steps as :class:`NumpyConv`."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.xp = torch

    def array(self, value: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))

    def numpy(self, value: Any) -> np.ndarray:
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value)

    def pad(self, x: Any, g: ConvGeometry) -> Any:
        top, left, bottom, right = g.pads
        if not any(g.pads):
            return x
        return self.torch.nn.functional.pad(x, (left, right, top, bottom))

    def forward(self, xp: Any, weight: Any, g: ConvGeometry) -> Any:
        return self.torch.nn.functional.conv2d(xp, weight, None, g.strides, 0, g.dilations, g.group)

    def backward(
        self, xp: Any, weight: Any, grad: Any, g: ConvGeometry, need_x: bool
    ) -> tuple[Any, Any]:
        nn_grad = self.torch.nn.grad  # type: ignore[attr-defined]
        dw = nn_grad.conv2d_weight(xp, weight.shape, grad, g.strides, 0, g.dilations, g.group)
        if not need_x:
            return None, dw
        dx = nn_grad.conv2d_input(xp.shape, weight, grad, g.strides, 0, g.dilations, g.group)
        return dx, dw


__all__ = ["ConvGeometry", "NumpyConv", "TorchConv"]
