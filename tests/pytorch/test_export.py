"""quantize_torch: export, export check, calibration mapping, names, accuracy on real data."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import onnxq
from onnxq.errors import CalibrationDataError, ConfigError, UnsupportedModelError
from onnxq.pytorch.export import module_pattern

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="torch is not installed (pip install -e '.[dev]' pins torch==2.13.0)"
)
N_TRAIN = 1437  # digits rows 0..1436 train and calibrate; 1437..1796 are held out


def test_module_pattern_follows_torchscript_scope_names():
    assert module_pattern("features.3.conv") == "/features/features.3/conv/*"
    assert module_pattern("layer1.0.downsample.0") == ("/layer1/layer1.0/downsample/downsample.0/*")
    assert module_pattern("0.1.0") == "/0/0.1/0.1.0/*"  # Sequential root: indices stay whole
    assert module_pattern("features.3*") == "/features/features.3*/*"
    with pytest.raises(ConfigError):
        module_pattern("features..3")


def test_import_without_torch_works_and_quantize_torch_says_how_to_install():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import onnxq\n"
        "try:\n"
        "    onnxq.quantize_torch(object(), None, [])\n"
        "except onnxq.ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    assert "ConfigError:" in run.stdout and "pip install 'onnxq[torch]'" in run.stdout


# -- helpers ------------------------------------------------------------------------------------
@pytest.fixture
def torch_cpu():
    """torch, seeded, on one thread with deterministic kernels (restored afterwards)."""
    torch = pytest.importorskip("torch")
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    yield torch
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def _session(model, optimize: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not optimize:  # the TensorRT backend's arithmetic: no Q/DQ fusion
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _two_input_module(torch):
    nn = torch.nn

    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1),
                nn.ReLU(),
            )
            self.side = nn.Linear(8, 32)
            self.head = nn.Linear(32, 16)
            self.embed = nn.Linear(32, 24)

        def forward(self, image, extra):
            f = self.features(image).mean((2, 3)) + torch.relu(self.side(extra))
            return {"logits": self.head(f), "embedding": self.embed(f)}

    return TwoHeads()


# -- (a) a real CNN trained on real data --------------------------------------------------------
@pytest.fixture(scope="module")
def digits_cnn():
    """A small CNN trained on sklearn digits (12 epochs, seed 0, one CPU thread)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    nn = torch.nn
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x_train, y_train, x_eval, y_eval = _digits()
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for _ in range(12):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 32):
            idx = perm[i : i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        float_acc = float((model(torch.from_numpy(x_eval)).argmax(1).numpy() == y_eval).mean())
    torch.set_num_threads(threads)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=64)
    return model, loader, x_eval, y_eval, float_acc


@needs_torch
@pytest.mark.parametrize(("backend", "optimize"), [("tensorrt", False), ("onnxruntime", True)])
def test_trained_digits_cnn_keeps_accuracy_on_held_out_rows(digits_cnn, backend, optimize):
    model, loader, x_eval, y_eval, float_acc = digits_cnn
    example = next(iter(loader))[0][:2]
    result = onnxq.quantize_torch(model, example, loader, backend=backend, progress=False)
    assert result.report.calibration_batches == len(loader)  # (inputs, labels) -> inputs
    assert [i.name for i in result.model.graph.input] == ["input"]  # forward's parameter name
    assert [o.name for o in result.model.graph.output] == ["output"]
    assert sum(n.op_type == "QuantizeLinear" for n in result.model.graph.node) >= 2
    logits = _session(result.model, optimize).run(None, {"input": x_eval})[0]
    int8_acc = float((logits.argmax(1) == y_eval).mean())
    assert float_acc > 0.9  # a real, trained classifier
    assert int8_acc >= float_acc - 0.01, (backend, float_acc, int8_acc)
    assert model.training is False  # eval() as before the call


# -- (b) two inputs, dict output ----------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_two_inputs_dict_output_names_and_closeness(torch_cpu, exporter):
    torch = torch_cpu
    if exporter == "dynamo" and importlib.util.find_spec("onnxscript") is None:
        pytest.skip("the dynamo exporter needs onnxscript")
    module = _two_input_module(torch).train()  # quantize_torch exports in eval mode
    example = (torch.randn(2, 3, 16, 16), torch.randn(2, 8))
    calib = [{"image": torch.randn(4, 3, 16, 16), "extra": torch.randn(4, 8)} for _ in range(8)]
    result = onnxq.quantize_torch(
        module, example, calib, exporter=exporter, progress=False, exclude=[module_pattern("embed")]
    )
    assert module.training is True  # restored
    graph = result.model.graph
    assert [i.name for i in graph.input] == ["image", "extra"]
    assert [o.name for o in graph.output] == ["logits", "embedding"]
    nodes = {n.name: n for n in graph.node}
    assert "/features/features.2/Conv" in nodes and "/embed/Gemm" in nodes  # scope names
    produced_by = {o: n.op_type for n in graph.node for o in n.output}
    assert produced_by[nodes["/embed/Gemm"].input[0]] != "DequantizeLinear"  # excluded: float
    assert produced_by[nodes["/head/Gemm"].input[0]] == "DequantizeLinear"
    test = (torch.randn(16, 3, 16, 16), torch.randn(16, 8))
    module.eval()
    with torch.no_grad():
        ref = module(*test)
    got = _session(result.model, False).run(
        None, {"image": test[0].numpy(), "extra": test[1].numpy()}
    )
    for name, value in zip(("logits", "embedding"), got, strict=True):
        expected = ref[name].numpy()
        cosine = float((expected * value).sum() / np.linalg.norm(expected) / np.linalg.norm(value))
        assert cosine > 0.999, name
        assert np.abs(expected - value).max() < 0.05 * np.abs(expected).max(), name


# -- calibration mapping, options, errors -------------------------------------------------------
@needs_torch
def test_calibration_forms_generator_numpy_and_calibration_fn(torch_cpu):
    torch = torch_cpu
    module = _two_input_module(torch)
    example = (torch.randn(2, 3, 16, 16), torch.randn(2, 8))
    rng = np.random.default_rng(0)
    pairs = [
        (
            rng.standard_normal((4, 3, 16, 16), dtype=np.float32),
            rng.standard_normal((4, 8), dtype=np.float32),
            "label",
        )
        for _ in range(6)
    ]
    one_pass = (p for p in pairs)  # a generator is read once; numpy arrays are fine too
    r1 = onnxq.quantize_torch(module, example, one_pass, progress=False)
    assert r1.report.calibration_batches == 6
    r2 = onnxq.quantize_torch(
        module,
        example,
        pairs,
        progress=False,
        calibration_fn=lambda item: {"image": item[0], "extra": item[1]},
    )
    assert r2.report.calibration_batches == 6
    with pytest.raises(CalibrationDataError, match="calibration_fn"):
        onnxq.quantize_torch(module, example, [torch.randn(4, 3, 16, 16)], progress=False)


@needs_torch
def test_dynamic_batch_by_default_and_static_on_request(torch_cpu):
    torch = torch_cpu
    module = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3), torch.nn.ReLU())
    calib = [torch.randn(2, 16, 8, 8) for _ in range(3)]
    dynamic = onnxq.quantize_torch(module, torch.randn(1, 16, 8, 8), calib, progress=False)
    static = onnxq.quantize_torch(
        module,
        torch.randn(2, 16, 8, 8),
        calib,
        dynamic_axes={},
        input_names=["x"],
        output_names=["y"],
        progress=False,
    )
    dims = dynamic.model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [16, 8, 8]
    assert static.model.graph.input[0].name == "x" and static.model.graph.output[0].name == "y"
    assert static.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


@needs_torch
def test_export_that_differs_from_the_module_is_refused_naming_the_output(
    torch_cpu, tmp_path, monkeypatch
):
    torch = torch_cpu

    class Counter(torch.nn.Module):
        """Its Python-side state is traced as a constant: the export differs from the call."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return {"scaled": x * float(self.calls)}

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="output 'scaled'"):
        onnxq.quantize_torch(Counter(), torch.ones(2, 4), [torch.ones(2, 4)], progress=False)
    assert list(tmp_path.iterdir()) == []  # the export folder is removed on failure too


@needs_torch
def test_option_errors(torch_cpu):
    torch = torch_cpu
    module = torch.nn.Linear(16, 16)
    x = torch.randn(2, 16)
    with pytest.raises(ConfigError, match="exporter"):
        onnxq.quantize_torch(module, x, [x], exporter="jit")
    with pytest.raises(ConfigError, match="dynamic_shapes"):
        onnxq.quantize_torch(module, x, [x], dynamic_shapes={"input": {0: "b"}})
    with pytest.raises(ConfigError, match="output_names"):
        onnxq.quantize_torch(module, x, [x], output_names=["a", "b"])
    with pytest.raises(ConfigError, match=r"torch\.nn\.Module"):
        onnxq.quantize_torch(lambda t: t, x, [x])


# -- the example script, as CI runs it ----------------------------------------------------------
@needs_torch
def test_pytorch_example_script_runs(tmp_path):
    pytest.importorskip("sklearn")
    script = ROOT / "examples" / "pytorch" / "quantize_resnet_like.py"
    run = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "--epochs", "6"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "resnet_like.int8.onnx").is_file()
    assert (tmp_path / "resnet_like.int8.json").is_file()
    assert "int8 accuracy" in run.stdout


# -- modules shaped like Hugging Face transformers ----------------------------------------------
def _decorated_like_transformers(torch):
    """forward wrapped as transformers 5 wraps it: the wrapper's signature is the original's
    (functools.wraps), and it sets a keyword itself, so a default passed positionally clashes."""
    import functools

    def merge_defaults(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            if len(args) > 1:  # as transformers' use_cache handling, which then adds the keyword
                raise TypeError(f"{func.__qualname__}() got multiple values for argument 'scale'")
            return func(self, *args, scale=2.0, **kwargs)

        return wrapper

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        @merge_defaults
        def forward(self, x, scale=None, output_attentions=None):
            return {"last_hidden_state": self.proj(x) * scale}

    return Encoder()


@needs_torch
def test_torchscript_export_passes_only_the_given_inputs_to_a_decorated_forward(torch_cpu):
    """torch.onnx's TorchScript exporter fills every defaulted forward parameter in positionally,
    which a transformers model's decorated forward refuses; onnxq passes the given ones only."""
    torch = torch_cpu
    module = _decorated_like_transformers(torch)
    forward = module.forward
    calib = [torch.randn(4, 16) for _ in range(4)]
    result = onnxq.quantize_torch(module, torch.randn(2, 16), calib, progress=False)
    assert [o.name for o in result.model.graph.output] == ["last_hidden_state"]
    assert "/proj/Gemm" in {n.name for n in result.model.graph.node}  # scope names unchanged
    assert module.forward == forward and "forward" not in vars(module)  # restored


@needs_torch
def test_a_key_value_cache_output_says_how_to_turn_it_off(torch_cpu):
    torch = torch_cpu

    class DynamicCache:  # what a transformers causal LM returns next to its logits by default
        pass

    class CausalLM(torch.nn.Module):
        def forward(self, input_ids):
            return {"logits": input_ids.float() * 2, "past_key_values": DynamicCache()}

    ids = torch.ones(2, 4, dtype=torch.int64)
    with pytest.raises(UnsupportedModelError, match=r"use_cache = False"):
        onnxq.quantize_torch(CausalLM(), ids, [ids], progress=False)


@needs_torch
def test_a_module_that_fails_on_the_example_inputs_names_forwards_parameters(torch_cpu):
    torch = torch_cpu

    class GPT2Like(torch.nn.Module):  # attention_mask is not forward's second parameter
        def forward(self, input_ids, past_key_values=None, attention_mask=None):
            return input_ids.float() + past_key_values.get_seq_length()

    ids = torch.ones(2, 4, dtype=torch.int64)
    with pytest.raises(ConfigError, match=r"forward\(input_ids, past_key_values, attention_mask"):
        onnxq.quantize_torch(GPT2Like(), (ids, ids), [(ids, ids)], progress=False)


@needs_torch
def test_an_export_that_fixes_the_batch_size_inside_its_dynamic_batch_graph_is_refused(torch_cpu):
    # the dynamo exporter does this silently to HF Swin and SegFormer: declared dynamic, it
    # failed on the first calibration batch of 2 with an onnxruntime Reshape error
    torch = torch_cpu

    class BatchFixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.head = torch.nn.Linear(16, 8)

        def forward(self, x):
            f = self.conv(x)
            pooled = f.reshape(int(f.shape[0]), 16, -1).mean(-1)  # traced as a constant
            return self.head(pooled)

    calib = [torch.randn(2, 16, 8, 8) for _ in range(3)]
    with pytest.raises(UnsupportedModelError, match=r"batch axis of 'x' dynamic .* batch size 2"):
        onnxq.quantize_torch(BatchFixed(), torch.randn(1, 16, 8, 8), calib, progress=False)
    static = onnxq.quantize_torch(
        BatchFixed(), torch.randn(2, 16, 8, 8), calib, dynamic_axes={}, progress=False
    )
    assert static.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
