"""Every model of the onnx package's own backend test data, quantized for both backends.

The onnx wheel ships about 140 small test models (``onnx/backend/test/data``: PyTorch-converted
layers and operators from opset 6 on, hand-written ``simple`` graphs) with their inputs and
expected outputs, and the ``light`` model-zoo graphs (opset 9, weights made by ConstantOfShape).
They are real exporters' output that no test graph of ours imitates: float64 tensors near 1e200,
opset-6 per-channel PRelu slopes, string inputs, training-only ops.

For each model: calibrate on its test input plus noisy copies, then either onnxq refuses it
with an onnxq error (never another exception: a crash), or the output passes ``onnx.checker``
and ``onnxq check`` and reproduces the test data's expected outputs (within 1e-3 where nothing
was quantized; cosine >= 0.99 where something was).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.errors import OnnxqError

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
# the light models' runs take 1-9 s each; these three cover their patterns in 3 s
LIGHT = ("light_squeezenet", "light_shufflenet", "light_inception_v1")
# refused with an onnxq error, and rightly: onnxruntime cannot run the float model (a training
# op); or may be, where its StringNormalizer needs a locale the machine may lack
REFUSED = re.compile(r"test_gradient_")


def _machine_lacks_locale(name: str, exc: OnnxqError) -> bool:
    return "test_strnorm_" in name and "locale" in str(exc)


def _cases() -> list[tuple[str, Path]]:
    cases = []
    for suite in ("pytorch-converted", "pytorch-operator", "simple"):
        for d in sorted((DATA / suite).glob("*/model.onnx")) if (DATA / suite).is_dir() else []:
            cases.append((f"{suite}/{d.parent.name}", d))
    cases += [
        (f"light/{name}", DATA / "light" / f"{name}.onnx")
        for name in LIGHT
        if (DATA / "light" / f"{name}.onnx").is_file()
    ]
    return cases


CASES = _cases()


def _test_data(
    name: str, path: Path, model: onnx.ModelProto
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, expected outputs) of the model's test data."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    outputs = list(model.graph.output)
    if name.startswith("light/"):  # onnx's runner feeds a ramp
        feed = {}
        for vi in inputs:
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            n = int(np.prod(shape))
            feed[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
        expected = path.with_name(f"{path.stem}_output_0.pb")
        return feed, {outputs[0].name: _read(expected)}
    data = path.parent / "test_data_set_0"
    feed = {vi.name: _read(data / f"input_{i}.pb") for i, vi in enumerate(inputs)}
    return feed, {vi.name: _read(data / f"output_{i}.pb") for i, vi in enumerate(outputs)}


def _read(path: Path) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(path)))


def _batches(feed: dict[str, np.ndarray], n: int = 6) -> list[dict[str, np.ndarray]]:
    """The test input and noisy copies of it (integer and text inputs unchanged)."""
    rng = np.random.default_rng(0)
    batches = [feed]
    for _ in range(n - 1):
        batch = {}
        for k, x in feed.items():
            if x.dtype.kind == "f" and x.size:
                peak = float(np.abs(x).max())
                std = peak * float(np.std(x / peak)) if peak > 0 else 1.0
                batch[k] = (x + rng.normal(0.0, 0.05 * (std or 1.0), x.shape)).astype(x.dtype)
            else:
                batch[k] = x
        batches.append(batch)
    return batches


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    peak = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0))) or 1.0
    a, b = a / peak, b / peak
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom else float(np.array_equal(a, b))


@pytest.mark.skipif(not CASES, reason="this onnx wheel ships no backend test data")
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow in onnxq's own arithmetic
@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
@pytest.mark.parametrize("name, path", CASES, ids=[c[0] for c in CASES])
def test_onnx_test_model(name: str, path: Path, backend: str):
    model = onnx.load(str(path))
    feed, expected = _test_data(name, path, model)
    try:
        result = onnxq.quantize(path, _batches(feed), backend=backend, progress=False)
    except OnnxqError as exc:
        assert REFUSED.search(name) or _machine_lacks_locale(name, exc), f"refused: {exc}"
        return
    assert not REFUSED.search(name), "expected a refusal"
    json.loads(result.report.to_json())  # finite numbers or null: a valid report
    out = result.model
    onnx.checker.check_model(out, full_check=True)
    assert check(out, PROFILES[backend]) == []
    quantized = any(n.op_type == "QuantizeLinear" for n in out.graph.node)
    # a TensorRT output computes what it does not quantize in FP16 (strong typing)
    half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in out.graph.initializer) or any(
        n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.FLOAT16 for n in out.graph.node
    )
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for key, got in zip(names, session.run(names, feed), strict=True):
        want = expected[key]
        if want.dtype.kind != "f":
            np.testing.assert_array_equal(got, want, err_msg=key)
        elif quantized:
            assert _cosine(got, want) >= 0.99, key
        elif half:  # FP16's 11 significant bits: a relative error near 1e-3 per op
            assert _cosine(got, want) >= 0.9999, key
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3, err_msg=key)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5, err_msg=key)
