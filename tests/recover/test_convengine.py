"""The two convolution engines of block reconstruction against torch's autograd: forward, and
the gradients of input and weight, for plain, strided, dilated, grouped and depthwise Convs
with asymmetric pads."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.recover.convengine import ConvGeometry, NumpyConv, TorchConv

torch = pytest.importorskip("torch")

CASES = {
    "3x3": (4, 6, 1, 3, 1, 1, (1, 1, 1, 1)),
    "depthwise-stride2-asym": (6, 6, 6, 3, 2, 1, (0, 1, 1, 0)),
    "grouped-dilated": (4, 8, 2, 3, 2, 2, (2, 2, 2, 2)),
    "1x1": (5, 3, 1, 1, 1, 1, (0, 0, 0, 0)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("engine", [NumpyConv, TorchConv], ids=["numpy", "torch"])
def test_forward_and_gradients_match_autograd(case, engine):
    c, o, groups, k, stride, dilation, pads = case
    g = ConvGeometry((stride, stride), (dilation, dilation), pads, groups)
    r = np.random.default_rng(0)
    x = r.standard_normal((2, c, 9, 8)).astype(np.float32)
    w = r.standard_normal((o, c // groups, k, k)).astype(np.float32)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    padded_t = torch.nn.functional.pad(xt, (pads[1], pads[3], pads[0], pads[2]))
    yt = torch.nn.functional.conv2d(padded_t, wt, None, g.strides, 0, g.dilations, groups)
    dy = r.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(dy))

    e = engine()
    padded = e.pad(e.array(x), g)
    y = e.numpy(e.forward(padded, e.array(w), g))
    dx, dw = e.backward(padded, e.array(w), e.array(dy), g, need_x=True)
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=1e-4)
    np.testing.assert_allclose(e.numpy(e.crop(dx, g)), xt.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(e.numpy(dw), wt.grad.numpy(), atol=1e-4)
    assert e.backward(padded, e.array(w), e.array(dy), g, need_x=False)[0] is None
