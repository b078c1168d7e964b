"""Where sessions run (``onnxq.runtime.device``): the CPU by default, CUDA when asked and present, a
clear error when it is not."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq.calibrate.session import make_session
from onnxq.cli import main
from onnxq.errors import ConfigError, ResourceError
from onnxq.runtime import device
from tests import graphs

HAS_CUDA = device.CUDA_PROVIDER in ort.get_available_providers()


NAMES = [("cpu", ("cpu", 0)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3))]


@pytest.mark.parametrize(("name", "parsed"), NAMES)
def test_device_names(name, parsed):
    assert device.is_device(name) and device.parse_device(name) == parsed


@pytest.mark.parametrize("name", ["gpu", "cuda:", "CUDA", "cpu:0", "cuda:x"])
def test_an_unknown_device_is_a_config_error(name):
    assert not device.is_device(name)
    with pytest.raises(ConfigError, match="cpu, cuda"):
        onnxq.QuantConfig(device=name)


def test_sessions_run_on_the_cpu_by_default_with_onnxruntimes_threads():
    session = make_session(graphs.conv_relu())
    assert session.get_providers() == [device.CPU_PROVIDER]
    options = ort.SessionOptions()
    assert device.configure(options) == {} and options.intra_op_num_threads == 0
    assert device.providers() == [device.CPU_PROVIDER]


def test_cuda_settings_ask_for_the_cuda_provider_without_silent_fallback():
    options = ort.SessionOptions()
    with device.using(device.SessionSettings("cuda:1", threads=2)):
        assert device.providers() == [
            (device.CUDA_PROVIDER, {"device_id": 1}),
            device.CPU_PROVIDER,
        ]
        assert device.configure(options) == {"enable_fallback": 0}
    assert options.intra_op_num_threads == 2 and options.use_deterministic_compute
    assert device.current() == device.SessionSettings()  # restored after the block


class _Session:
    def get_providers(self) -> list[str]:
        return [device.CPU_PROVIDER]


def test_a_session_that_came_up_without_cuda_is_refused():
    assert isinstance(device.confirm(_Session()), _Session)  # on the CPU: fine
    with device.using(device.SessionSettings("cuda")), pytest.raises(ResourceError) as caught:
        device.confirm(_Session())
    assert "without its CUDA execution provider" in str(caught.value)
    assert "--device cpu" in str(caught.value)


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has the CUDA provider")
def test_cuda_without_onnxruntime_gpu_says_what_to_install():
    with pytest.raises(ResourceError, match="has no CUDA execution provider") as caught:
        device.check_device("cuda")
    assert "onnxruntime-gpu" in str(caught.value)


def test_cuda_provider_without_a_device_says_so(monkeypatch):
    available = [device.CUDA_PROVIDER, device.CPU_PROVIDER]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)

    def no_device(*args, **kwargs):
        raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")

    monkeypatch.setattr(ort, "InferenceSession", no_device)
    with pytest.raises(ResourceError, match="cannot start its CUDA execution provider on device 2"):
        device.check_device("cuda:2")


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has the CUDA provider")
def test_the_cli_refuses_cuda_here_in_one_line_and_writes_nothing(tmp_path, calib_dir, capsys):
    model = graphs.conv_relu()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "out.onnx"
    args = [str(path), "-o", str(out), "--calib", str(calib_dir(model)), "-q"]
    assert main(["quantize", *args, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "onnxruntime-gpu" in err[0]
    assert not out.exists()


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a CUDA device")
def test_calibration_on_cuda_quantizes():
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 4)
    on_gpu = onnxq.quantize(model, batches, progress=False, device="cuda")
    on_cpu = onnxq.quantize(model, batches, progress=False)
    assert len(on_gpu.report.quantized_ops) == len(on_cpu.report.quantized_ops)
