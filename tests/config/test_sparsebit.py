"""Sparsebit qconfig compatibility: mapping, SPECIFIC overrides in the model, errors."""

from __future__ import annotations

import fnmatch
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import Override, QuantConfig
from onnxq.cli import main as cli_main
from onnxq.config.sparsebit import is_sparsebit, name_glob
from onnxq.errors import ConfigError
from onnxq.materialize.qdq import read_metadata
from onnxq.pytorch.export import export_module
from tests import graphs

# The structure of Sparsebit's examples/post_training_quantization/*/qconfig.yaml (TensorRT,
# MSE activations, SPECIFIC as yacs merge lists) plus SKIP_TRACE_MODULES and a W SPECIFIC
# entry as in its bevdepth qconfig.
SPARSEBIT_QCONFIG = """\
BACKEND: tensorrt
SKIP_TRACE_MODULES: [
  "img_view_transformer",
]
SCHEDULE:
  FUSE_BN: True
W:
  QSCHEME: per-channel-symmetric
  QUANTIZER:
    TYPE: uniform
    BIT: 8
  OBSERVER:
    TYPE: MINMAX
  SPECIFIC: [{
    "features_3_conv": ["QUANTIZER.BIT", 4],
  }]
A:
  QSCHEME: per-tensor-symmetric
  QUANTIZER:
    TYPE: uniform
    BIT: 8
  OBSERVER:
    TYPE: MSE
    LAYOUT: NCHW
  SPECIFIC: [{ # bit=0 is disable_quant
    "*ln*": ["QUANTIZER.DISABLE", True],
    "head": ["QUANTIZER.DISABLE", True],
    "features_3_conv": ["QUANTIZER.BIT", 4, "OBSERVER.TYPE", "MINMAX"],
  }]
"""

EXPECTED = QuantConfig(
    backend="tensorrt",
    method="mse",
    weight_method="minmax",
    exclude=("/img_view_transformer/*",),
    overrides=(
        Override(node="*/features[._/]3[._/]conv/*", bits=4),
        Override(node="*/features[._/]3[._/]conv/*", bits=4, method="minmax"),
        Override(node="*/head/*", exclude=True),
        Override(node="*/*ln*/*", exclude=True),
    ),
)


def _write(tmp_path, text: str, name: str = "qconfig.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_sparsebit_qconfig_loads_through_from_yaml(tmp_path):
    assert QuantConfig.from_yaml(_write(tmp_path, SPARSEBIT_QCONFIG)) == EXPECTED


def test_sparsebit_imagenet_ptq_qconfig_is_plain_tensorrt_minmax(tmp_path):
    # Sparsebit's examples/imagenet_ptq/qconfig.yaml, verbatim.
    text = (
        "BACKEND: tensorrt\nSCHEDULE:\n  FUSE_BN: True\nW:\n  QSCHEME: per-channel-symmetric\n"
        "  QUANTIZER:\n    TYPE: uniform\n    BIT: 8\n  OBSERVER:\n    TYPE: MINMAX\nA:\n"
        "  QSCHEME: per-tensor-symmetric\n  QUANTIZER:\n    TYPE: uniform\n    BIT: 8\n"
        "  OBSERVER:\n    TYPE: MINMAX\n    LAYOUT: NCHW\n"
    )
    cfg = QuantConfig.from_yaml(_write(tmp_path, text))
    assert cfg == QuantConfig(backend="tensorrt", method="minmax", weight_method="minmax")


def test_onnxruntime_schemes_percentile_and_low_bits():
    cfg = QuantConfig.from_sparsebit(
        {
            "BACKEND": "ONNXRuntime",
            "W": {
                "QSCHEME": "per-tensor-symmetric",
                "QUANTIZER": {"TYPE": "uniform", "BIT": 6},
                "OBSERVER": {"TYPE": "MSE"},
            },
            "A": {
                "QSCHEME": "per-tensor-symmetric",
                "QUANTIZER": {"BIT": 6},
                "OBSERVER": {"TYPE": "PERCENTILE", "PERCENTILE": {"ALPHA": 0.0001}},
            },
        }
    )
    assert (cfg.backend, cfg.method, cfg.percentile, cfg.weight_method) == (
        "onnxruntime",
        "percentile",
        99.99,
        "mse",
    )
    assert cfg.overrides == (
        Override(node="*", bits=6),
        *(
            Override(op_type=op, per_channel=False)
            for op in ("Conv", "ConvTranspose", "Gemm", "MatMul")
        ),
        Override(node="*", symmetric=True),
    )


@pytest.mark.parametrize(
    ("observer", "method"),
    [
        ("KL_HISTOGRAM", "entropy"),
        ("kl", "entropy"),
        ("ACIQ", "aciq"),
        ("MOVING_AVERAGE", "ema"),
        ("MINMAX", "minmax"),
    ],
)
def test_observer_types_map_to_methods(observer, method):
    doc = {"BACKEND": "tensorrt", "A": {"OBSERVER": {"TYPE": observer}}}
    assert QuantConfig.from_sparsebit(doc).method == method


def test_onnxq_yaml_is_not_taken_for_sparsebit(tmp_path):
    assert not is_sparsebit({"backend": "tensorrt", "method": "mse"})
    cfg = QuantConfig.from_yaml(_write(tmp_path, "backend: onnxruntime\nmethod: mse\n"))
    assert (cfg.backend, cfg.method) == ("onnxruntime", "mse")


def test_name_glob_matches_torchscript_scopes():
    glob = name_glob("layer1_0_conv1")
    assert fnmatch.fnmatchcase("/layer1/layer1.0/conv1/Conv", glob)
    assert fnmatch.fnmatchcase("/backbone/layer1/layer1.0/conv1/Conv", glob)  # any depth
    assert not fnmatch.fnmatchcase("/layer1/layer1.0/conv10/Conv", glob)
    assert not fnmatch.fnmatchcase("/layer1/layer1.1/conv1/Conv", glob)
    assert name_glob("*/Softmax*") == "*/Softmax*"  # an ONNX glob passes through


def test_name_glob_matches_a_real_torch_export():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return self.conv1(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer1 = nn.Sequential(Block())

        def forward(self, x):
            return self.layer1(x)

    model, _ = export_module(Net(), torch.randn(1, 16, 4, 4))
    conv = [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert conv == ["/layer1/layer1.0/conv1/Conv"]
    assert fnmatch.fnmatchcase(conv[0], name_glob("layer1_0_conv1"))  # Sparsebit's fx name


# -- SPECIFIC reaches the quantized model ------------------------------------------------------
def _torch_named_model() -> onnx.ModelProto:
    """x -> /features/features.0/Conv -> Relu -> /features/features.3/conv/Conv -> Relu
    -> GlobalAveragePool -> Flatten -> /head/Gemm, with TorchScript-style node names."""
    r = graphs.rng(0)
    c = 16
    nodes = [
        helper.make_node(
            "Conv", ["x", "w0", "b0"], ["c0"], name="/features/features.0/Conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["c0"], ["r0"], name="/features/features.1/Relu"),
        helper.make_node(
            "Conv",
            ["r0", "w3", "b3"],
            ["c3"],
            name="/features/features.3/conv/Conv",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["c3"], ["r3"], name="/features/features.3/act/Relu"),
        helper.make_node("GlobalAveragePool", ["r3"], ["p"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
        helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], name="/head/Gemm", transB=1),
    ]
    shapes = {
        "w0": (c, c, 3, 3),
        "b0": (c,),
        "w3": (c, c, 3, 3),
        "b3": (c,),
        "wh": (c, c),
        "bh": (c,),
    }
    inits = [graphs.init(name, graphs.weight(r, *shape)) for name, shape in shapes.items()]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["N", c, 8, 8])],
        [graphs.tensor("y", ["N", c])],
        inits,
        name="torch_named",
    )


def test_specific_overrides_show_in_the_quantized_models_metadata(tmp_path, capsys):
    config = _write(tmp_path, SPARSEBIT_QCONFIG)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((2, 16, 8, 8), dtype=np.float32)} for _ in range(4)]
    result = onnxq.quantize(_torch_named_model(), batches, config=config, progress=False)
    records = read_metadata(result.model)
    assert records is not None
    # features.3.conv: 4-bit weight and input, its input calibrated by MINMAX (SPECIFIC)
    assert (records["w3"]["bits"], records["r0"]["bits"], records["r0"]["method"]) == (
        4,
        4,
        "minmax",
    )
    # features.0: the global settings (8 bits, MSE activations)
    assert (records["w0"]["bits"], records["x"]["bits"], records["x"]["method"]) == (8, 8, "mse")
    assert "wh" not in records and "f" not in records  # head: QUANTIZER.DISABLE -> float
    out = tmp_path / "q.onnx"
    result.save(out)
    capsys.readouterr()
    assert cli_main(["inspect", str(out)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("r0 "))
    assert line.split()[1:5] == ["activation", "4", "int8", "minmax"]


# -- what has no post-training equivalent --------------------------------------------------------
def _base(**sections):
    doc = {
        "BACKEND": "tensorrt",
        "W": {"QSCHEME": "per-channel-symmetric", "QUANTIZER": {"TYPE": "uniform", "BIT": 8}},
        "A": {"QSCHEME": "per-tensor-symmetric", "QUANTIZER": {"TYPE": "uniform", "BIT": 8}},
    }
    doc.update(sections)
    return doc


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        (_base(QAT={"ENABLE": True}), ["QAT", "training-time"]),
        (_base(LSQ={}), ["LSQ", "post-training"]),
        (_base(REGULARIZER={"ENABLE": True, "TYPE": "dampen"}), ["REGULARIZER", "training-time"]),
        (
            _base(
                W={"QSCHEME": "per-channel-symmetric", "QUANTIZER": {"TYPE": "lsq", "BIT": 4}},
                A={"QSCHEME": "per-tensor-symmetric", "QUANTIZER": {"TYPE": "lsq+", "BIT": 4}},
            ),
            ["W.QUANTIZER.TYPE", "lsq", "training-time"],
        ),
        (_base(A={"QUANTIZER": {"TYPE": "pact", "BIT": 8}}), ["A.QUANTIZER.TYPE", "pact"]),
        (_base(W={"QUANTIZER": {"TYPE": "adaround", "BIT": 8}}), ["W.QUANTIZER.TYPE", "AdaRound"]),
        (
            _base(W={"QUANTIZER": {"BIT": 8, "TRAINING": {"ENABLE": True}}}),
            ["W.QUANTIZER.TRAINING.ENABLE"],
        ),
        (_base(SCHEDULE={"BN_TUNING": True}), ["SCHEDULE.BN_TUNING"]),
        (_base(BACKEND="virtual"), ["BACKEND", "'virtual'", "tensorrt, onnxruntime"]),
        (_base(FOO=1), ["'FOO'"]),
        (_base(SPECIFIC=[]), ["SPECIFIC", "under W: and A:"]),
        (_base(W={"QSCHEME": "per-channel-affine"}), ["W.QSCHEME", "symmetric"]),
        (_base(A={"QSCHEME": "per-tensor-affine"}), ["A.QSCHEME", "TensorRT"]),
        (_base(A={"QSCHEME": "per-channel-symmetric"}), ["A.QSCHEME", "per tensor"]),
        (_base(W={"QUANTIZER": {"BIT": 4}}), ["W.QUANTIZER.BIT=4", "A.QUANTIZER.BIT=8"]),
        (_base(W={"QUANTIZER": {"BIT": 9}}), ["W.QUANTIZER.BIT", "2..8"]),
        (_base(W={"OBSERVER": {"TYPE": "KL_HISTOGRAM"}}), ["W.OBSERVER.TYPE", "MINMAX or MSE"]),
        (_base(A={"OBSERVER": {"TYPE": "HISTOGRAM"}}), ["A.OBSERVER.TYPE", "'HISTOGRAM'"]),
        (
            _base(A={"SPECIFIC": [{"conv1": ["QUANTIZER.FOO", 1]}]}),
            ["A.SPECIFIC['conv1'].QUANTIZER.FOO"],
        ),
        (_base(A={"SPECIFIC": [{"conv1": ["QUANTIZER.BIT"]}]}), ["A.SPECIFIC['conv1']", "pairs"]),
        (
            _base(
                A={
                    "OBSERVER": {"TYPE": "PERCENTILE"},
                    "SPECIFIC": [
                        {
                            "conv1": [
                                "OBSERVER.TYPE",
                                "PERCENTILE",
                                "OBSERVER.PERCENTILE.ALPHA",
                                0.01,
                            ]
                        }
                    ],
                }
            ),
            ["OBSERVER.PERCENTILE.ALPHA", "one percentile"],
        ),
        (
            _base(W={"SPECIFIC": [{"conv1": ["OBSERVER.TYPE", "MSE"]}]}),
            ["W.SPECIFIC['conv1']", "one weight observer"],
        ),
    ],
)
def test_keys_without_an_onnxq_equivalent_are_config_errors_naming_the_key(doc, names):
    with pytest.raises(ConfigError) as info:
        QuantConfig.from_sparsebit(doc, where="q.yaml")
    message = str(info.value)
    assert message.startswith("q.yaml: ")
    for name in names:
        assert name in message, (name, message)


def test_inert_sparsebit_defaults_are_accepted():
    # A dumped full yacs config carries defaults for features that are switched off.
    doc = _base(
        DEVICE="cuda",
        REGULARIZER={"ENABLE": False},
        SCHEDULE={"FUSE_BN": False, "BN_TUNING": False, "DISABLE_UNNECESSARY_QUANT": True},
    )
    doc["A"]["QUANTIZER"]["PACT"] = {"ALPHA_VALUE": 10}
    doc["A"]["OBSERVER"] = {
        "TYPE": "MINMAX",
        "PERCENTILE": {"ALPHA": 0.001},
        "MOVING_AVERAGE": {"EMA_RATIO": 0.9},
        "LAYOUT": "NLC",
    }
    doc["W"]["QUANTIZER"]["TRAINING"] = {"ENABLE": False, "LR": 4e-5, "ITERS": 20000}
    doc["A"]["SPECIFIC"] = [{"patch_embed_proj": ["OBSERVER.LAYOUT", "NCHW"]}]  # deit example
    cfg = QuantConfig.from_sparsebit(doc)
    assert cfg == QuantConfig(backend="tensorrt", method="minmax", weight_method="minmax")
