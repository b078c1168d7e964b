"""TensorRT engine check: the inspector JSON of 10.x and 11.x, the version-dependent build path
(through a fake ``tensorrt`` module), and the real build where the tensorrt package and an NVIDIA
GPU exist."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

import onnxq
from onnxq.backends import tensorrt as trt_backend
from onnxq.backends.tensorrt import (
    build_engine,
    build_plan,
    carries_typed_precisions,
    precision_of,
    quantized_readers,
    read_engine_information,
    tensorrt_available,
    tensorrt_major,
)
from onnxq.cli import main
from onnxq.errors import ConfigError
from tests import graphs

REASON = tensorrt_available()
DATA = Path(__file__).parent / "data"  # sources: data/README.md


def sample(version: int) -> dict:
    return json.loads((DATA / f"inspector_trt{version}.json").read_text())


@pytest.fixture(scope="module")
def qdq_models(tmp_path_factory) -> dict[str, Path]:
    """residual_add quantized for tensorrt with FP32 and with FP16 float compute."""
    folder = tmp_path_factory.mktemp("trt")
    paths = {}
    for high in ("fp32", "fp16"):
        model = graphs.residual_add()
        batches = graphs.random_batches(model, 2)
        result = onnxq.quantize(model, batches, progress=False, high_precision=high)
        paths[high] = folder / f"q_{high}.onnx"
        result.save(paths[high])
    return paths


# ------------------------------------------------------------------ inspector JSON, both layouts
def test_trt10_sample_reads_layers_bindings_and_format_datatype():
    report = read_engine_information((DATA / "inspector_trt10.json").read_text())
    assert report.schema == "10.x"
    assert [(lay.name, lay.layer_type) for lay in report.layers] == [
        ("node_conv2d + node_relu", "CaskConvolution"),
        ("node_max_pool2d", "CaskPooling"),
        ("node_conv2d_1 + node_relu_1", "CaskConvolution"),
        ("node_max_pool2d_1", "CaskPooling"),
        ("node_linear_myl4_0", "gemm"),
        ("__myl_MulSum_myl4_1", "kgen"),
        ("__myl_AddMaxrSubExpSum_myl4_2", "kgen"),
        ("__myl_DivMulMaxr_myl4_3", "kgen"),
        ("__myl_CastReshCast_myl4_4", "kgen"),
    ]
    first, last = report.layers[0], report.layers[-1]
    assert [(t.name, t.precision, t.datatype) for t in first.inputs] == [("x", "FP32", "Float")]
    assert [(t.name, t.precision) for t in first.outputs] == [("relu", "FP32")]
    assert first.onnx_nodes[:2] == ("node_conv2d", "node_relu")  # Metadata, \u001e-joined
    assert report.layers[4].onnx_nodes[:2] == ("node_linear", "node_relu_2")  # \u001f-joined
    assert [t.precision for t in report.layers[7].outputs] == ["FP32", "INT32"]
    assert [(t.name, t.precision) for t in last.inputs + last.outputs] == [
        ("__myln_k_arg__bb1_8_myl4", "INT32"),
        ("z", "INT64"),
    ]
    assert [(t.name, t.mode, t.precision) for t in report.io_tensors] == [
        ("x", "Input", "FP32"),
        ("y", "Output", "FP32"),
        ("z", "Output", "INT64"),
    ]
    assert report.precisions == {"FP32": 8, "INT32": 1}


def test_trt11_sample_reads_io_tensors_datatype_and_constants():
    report = read_engine_information((DATA / "inspector_trt11.json").read_text())
    assert report.schema == "11.x"
    assert [lay.name for lay in report.layers] == [
        "__mye1085_myl0_0",
        "__myl_Move_myl0_1",
        "node_conv2d_myl0_2",
        "node_max_pool2d_myl0_3",
        "node_conv2d_1_myl0_4",
        "node_max_pool2d_1_myl0_5",
        "__myl_Resh_myl0_6",
        "node_linear_myl0_7",
        "__myl_MulSum_myl0_8",
        "__myl_AddMaxrSubExpSum_myl0_9",
        "__myl_DivMulMaxr_myl0_10",
        "__myl_CastReshCast_myl0_11",
        "__mye1087_myl0_12",
    ]
    kinds = " ".join(lay.layer_type for lay in report.layers)
    assert kinds == (
        "custom_layer kgen correlation maxpool correlation maxpool kgen gemm kgen kgen kgen kgen "
        "custom_layer"
    )
    conv = report.layers[2]
    assert [(t.name, t.precision, t.format) for t in conv.inputs] == [
        ("relu.1_2_myl0", "FP32", "(NHWC) Channel major format")
    ]
    assert [t.name for t in conv.constants] == [
        "__mye1002dconst_myl0",
        "__mye1089_const_myl0",
        "__mye1093_const_myl0",
        "__mye1007dconst_myl0",
    ]
    assert {t.precision for t in conv.constants} == {"FP32"}
    assert conv.onnx_nodes[:2] == ("node_conv2d", "node_relu")
    cache = report.layers[0]
    assert len(cache.inputs) == 18 and cache.outputs == () and cache.precision == "UINT8"
    assert [t.precision for t in cache.inputs[-2:]] == ["UINT64", "UINT64"]
    assert [(t.precision, t.datatype) for t in report.layers[11].outputs] == [("INT64", "Int64")]
    assert [(t.name, t.mode, t.precision, t.datatype) for t in report.io_tensors] == [
        ("x", "Input", "FP32", "Float"),  # spelled "DataType" in I/O Tensors
        ("y", "Output", "FP32", "Float"),
        ("z", "Output", "INT64", "Int64"),
    ]
    assert report.io_tensors[2].format == "Row major linear INT64 format (kLINEAR)"
    assert report.precisions == {"UINT8": 2, "FP32": 10, "INT32": 1}
    split = report.split()
    assert split["INT8/FP8/INT4/FP4"] == () and split["FP16/BF16"] == ()
    assert len(split["FP32"]) == 10
    assert split["other"] == ("__mye1085_myl0_0", "__myl_CastReshCast_myl0_11", "__mye1087_myl0_12")


@pytest.mark.parametrize(
    ("text", "precision"),
    [
        ("Float", "FP32"),
        ("Half", "FP16"),
        ("Int8", "INT8"),
        ("UInt8", "UINT8"),
        ("Int32", "INT32"),
        ("Int64", "INT64"),
        ("UInt64", "UINT64"),
        ("BFloat16", "BF16"),
        ("FP8", "FP8"),
        ("Int4", "INT4"),
        ("FP4", "FP4"),
        ("Row major linear FP16 format", "FP16"),  # 10.x layouts (facts file, section 3)
        ("Channel major FP16 format where channel % 4 == 0", "FP16"),
        ("Thirty-two wide channel vectorized row major Int8 format.", "INT8"),
        ("Row major linear FP32 format (kLINEAR)", "FP32"),
        ("(NHWC) Channel major format", "unknown"),  # an 11.x Format is a layout only
        ("", "unknown"),
    ],
)
def test_precision_spellings(text, precision):
    assert precision_of(text) == precision


def test_each_tensor_key_spelling_is_read():
    tensors = [
        {"Name": "a", "Datatype": "Int8", "Format": "(Linear) Row major linear format"},
        {"Name": "b", "DataType": "Half"},
        {"Name": "c", "Format/Datatype": "Row major linear FP16 format"},
        {"Name": "d", "Format": "(Linear) Row major linear format"},
    ]
    info = {"Layers": [{"Name": "l", "LayerType": "kgen", "Inputs": tensors}], "Bindings": []}
    layer = read_engine_information(info).layers[0]
    assert [t.precision for t in layer.inputs] == ["INT8", "FP16", "FP16", "unknown"]
    assert layer.precision == "INT8"  # the narrowest type it reads


# --------------------------------------------------- quantized ONNX nodes against engine layers
def test_trt10_int8_intent_found_missed_and_unlocated():
    info = sample(10)  # one tensor changed: the facts file's 10.x INT8 layout string
    info["Layers"][0]["Inputs"][0]["Format/Datatype"] = (
        "Thirty-two wide channel vectorized row major Int8 format."
    )
    want = {"node_conv2d": "INT8", "node_conv2d_1": "INT8", "node_gone": "INT8"}
    report = replace(read_engine_information(info), expected=want)
    assert report.split()["INT8/FP8/INT4/FP4"] == ("node_conv2d + node_relu",)
    assert report.missed == {"node_conv2d_1": "FP32"}
    assert report.unlocated == ("node_gone",)
    text = report.summary()
    assert "quantized ONNX nodes: 1 of 3 run in the precision of their Q/DQ (INT8 x3)" in text
    assert "not in INT8: 'node_conv2d_1' runs in FP32" in text
    assert "node_gone" in text.splitlines()[-1]


def test_trt11_int8_and_fp16_layers_split():
    info = sample(11)  # types changed in a copy: no INT8 or FP16 11.x sample was found
    conv, conv_1 = info["Layers"][2], info["Layers"][4]
    conv["Inputs"][0]["Datatype"] = "Int8"
    conv["Constants"][0]["Datatype"] = "Int8"
    conv_1["Inputs"][0]["Datatype"] = "Half"
    info["Layers"][8]["Inputs"][0]["Datatype"] = "Int8"  # node_linear_1: in layers 8 and 9
    want = {"node_conv2d": "INT8", "node_conv2d_1": "INT8", "node_linear_1": "INT8"}
    report = replace(read_engine_information(info), expected=want)
    split = report.split()
    assert split["INT8/FP8/INT4/FP4"] == ("node_conv2d_myl0_2", "__myl_MulSum_myl0_8")
    assert split["FP16/BF16"] == ("node_conv2d_1_myl0_4",)
    # node_linear_1 is not missed: one of its two layers runs in INT8
    assert report.missed == {"node_conv2d_1": "FP16"} and report.unlocated == ()
    assert report.precisions == {"UINT8": 2, "FP32": 7, "INT8": 2, "FP16": 1, "INT32": 1}


def test_onnx_side_quantized_readers_and_typed_precisions(qdq_models):
    for high, path in qdq_models.items():
        model = onnx.load(str(path))
        assert quantized_readers(model) == {"conv1": "INT8", "conv2": "INT8", "add": "INT8"}, high
    assert not carries_typed_precisions(onnx.load(str(qdq_models["fp32"])))
    assert carries_typed_precisions(onnx.load(str(qdq_models["fp16"])))


# --------------------------------------------------------- version detection and build path
@pytest.mark.parametrize(
    ("version", "major"), [("10.16.0", 10), ("10.16.1.11", 10), ("11.4.0", 11), ("11", 11)]
)
def test_tensorrt_major(version, major):
    assert tensorrt_major(types.SimpleNamespace(__version__=version)) == major


@pytest.mark.parametrize("version", ["", "eleven", None])
def test_tensorrt_major_refuses_an_unreadable_version(version):
    fake = (
        types.SimpleNamespace() if version is None else types.SimpleNamespace(__version__=version)
    )
    with pytest.raises(ConfigError, match="TensorRT's version"):
        tensorrt_major(fake)


def fake_tensorrt(version: str, inspector: str, calls: dict) -> types.ModuleType:
    """A stand-in ``tensorrt`` module: records how the network and config are set up.  11.x has
    no precision BuilderFlag members (an unguarded ``BuilderFlag.INT8`` raises AttributeError)."""
    ns = types.SimpleNamespace
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version  # type: ignore[attr-defined]
    eleven = version.startswith("11")
    flags = {"TF32": "TF32"} if eleven else {"INT8": "INT8", "FP16": "FP16", "TF32": "TF32"}
    network = ns(num_inputs=0)
    config = ns(
        set_memory_pool_limit=lambda pool, size: calls.setdefault("pool", (pool, size)),
        set_flag=lambda flag: calls["flags"].append(flag),
    )

    def information(fmt: str) -> str:
        calls["fmt"] = fmt
        return inspector

    engine = ns(create_engine_inspector=lambda: ns(get_engine_information=information))
    builder = ns(
        create_network=lambda flag: calls["network"].append(flag) or network,
        create_builder_config=lambda: config,
        build_serialized_network=lambda net, cfg: b"plan",
    )
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})  # type: ignore[attr-defined]
    trt.Builder = lambda logger: builder  # type: ignore[attr-defined]
    trt.OnnxParser = lambda net, logger: ns(parse_from_file=lambda path: True, num_errors=0)  # type: ignore[attr-defined]
    trt.Runtime = lambda logger: ns(deserialize_cuda_engine=lambda blob: engine)  # type: ignore[attr-defined]
    trt.BuilderFlag = ns(**flags)  # type: ignore[attr-defined]
    trt.NetworkDefinitionCreationFlag = ns(EXPLICIT_BATCH=0, STRONGLY_TYPED=1)  # type: ignore[attr-defined]
    trt.MemoryPoolType = ns(WORKSPACE="WORKSPACE")  # type: ignore[attr-defined]
    trt.ProfilingVerbosity = ns(DETAILED="DETAILED")  # type: ignore[attr-defined]
    trt.LayerInformationFormat = ns(JSON="JSON")  # type: ignore[attr-defined]
    return trt


@pytest.mark.parametrize(
    ("version", "high", "network", "flags", "build"),
    [
        ("10.16.0", "fp32", 0, ["INT8", "FP16"], "TensorRT 10.16.0, weakly typed with INT8+FP16"),
        ("10.16.0", "fp16", 1 << 1, [], "TensorRT 10.16.0, strongly typed"),
        ("11.4.0", "fp32", 0, [], "TensorRT 11.4.0, strongly typed"),
        ("11.4.0", "fp16", 0, [], "TensorRT 11.4.0, strongly typed"),
    ],
)
def test_build_path_by_version(monkeypatch, qdq_models, version, high, network, flags, build):
    calls: dict = {"network": [], "flags": []}
    schema = 11 if version.startswith("11") else 10
    inspector = (DATA / f"inspector_trt{schema}.json").read_text()
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, inspector, calls))
    monkeypatch.setattr(trt_backend, "tensorrt_available", lambda: None)
    report = build_engine(qdq_models[high])
    assert calls["network"] == [network]
    assert calls["flags"] == flags
    assert calls["fmt"] == "JSON" and calls["pool"] == ("WORKSPACE", 2048 * 2**20)
    assert report.build == build and report.schema == f"{schema}.x"
    assert len(report.layers) == (13 if schema == 11 else 9)
    assert report.expected == {"conv1": "INT8", "conv2": "INT8", "add": "INT8"}
    assert report.unlocated == ("conv1", "conv2", "add")  # the sample is another model
    assert report.summary().startswith(f"TensorRT engine: {len(report.layers)} layers (")


def test_trt10_without_strongly_typed_flag_falls_back_to_precision_flags():
    ns = types.SimpleNamespace
    old = ns(
        __version__="10.0.1", BuilderFlag=ns(INT8=1, FP16=2), NetworkDefinitionCreationFlag=ns()
    )
    plan = build_plan(old, typed_model=True)
    assert (plan.network_flags, plan.builder_flags, plan.strongly_typed) == (
        0,
        ("INT8", "FP16"),
        False,
    )


# ----------------------------------------------------------------------------- real TensorRT
@pytest.mark.skipif(REASON is not None, reason=f"TensorRT engine build impossible here: {REASON}")
def test_engine_builds_with_int8_layers(tmp_path):
    model = graphs.residual_add()
    path = tmp_path / "q.onnx"
    onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).save(path)
    report = build_engine(path)
    assert report.layers and report.precisions.get("INT8", 0) > 0
    assert report.missed == {}, report.summary()


@pytest.mark.skipif(REASON is None, reason="TensorRT is available: the refusal path cannot run")
def test_without_tensorrt_the_engine_check_says_what_is_missing(tmp_path, capsys):
    model = graphs.conv_relu()
    path = tmp_path / "q.onnx"
    onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).save(path)
    with pytest.raises(ConfigError, match="cannot build a TensorRT engine"):
        build_engine(path)
    assert main(["check", str(path), "--engine"]) == 2  # the static check still ran first
    captured = capsys.readouterr()
    assert "0 tensorrt violation(s)" in captured.out
    assert "tensorrt" in captured.err.lower()
