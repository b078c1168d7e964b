"""The onnxruntime profile tuned for a CPU class: weight range, cost table, and what the output
and its report record."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxq
from onnxq import ir
from onnxq.backends.cost_tables import SHIPPED, CostTable
from onnxq.backends.cpu import ENV_VAR
from onnxq.backends.profile import PROFILES, BackendProfile
from onnxq.backends.target import profile_for, target_mismatch, tune_profile
from onnxq.cli import main
from onnxq.config.options import ProfileOptions
from onnxq.errors import ConfigError
from onnxq.materialize.qdq import read_metadata, read_target_cpu
from tests import graphs
from tests.cpus import skip_unless_fused_numerics_here
from tests.place.rules.test_cost import SEPARABLE, net


def tuned(
    backend: str,
    reduce_range: bool | None = None,
    target_cpu: str | None = None,
    cost_table: str | None = None,
) -> tuple[BackendProfile, str]:
    return profile_for(ProfileOptions(backend, False, reduce_range, target_cpu, cost_table))


def test_tensorrt_is_the_same_for_every_cpu():
    profiles = []
    for target in ("x86-avx2", "x86-vnni", None):
        profile, note = tuned("tensorrt", None, target)
        assert note == "" and profile.target_cpu is None
        profiles.append(profile)
    assert profiles[0] == profiles[1] == profiles[2]
    # the shipped profile, with the opset its default FP16 compute needs (FP16 Q/DQ scales)
    assert profiles[0] == PROFILES["tensorrt"].replace(min_opset=19)


def test_x86_without_int8_dot_products_gets_8_bit_weights_stored_as_uint8():
    profile, note = tuned("onnxruntime", None, "x86-avx2")
    assert (profile.target_cpu, profile.weight_dtype, profile.weight_qmax) == (
        "x86-avx2",
        "uint8",
        127,
    )
    assert profile.depthwise_weight_qmax is None and note == ""  # the same numbers as int8
    assert "not measured on this class (x86-avx2)" in profile.cost_table


def test_reduce_range_on_x86_without_int8_dot_products_gives_7_bit_int8_but_8_bit_depthwise():
    profile, note = tuned("onnxruntime", True, "x86-avx2")
    assert (profile.weight_dtype, profile.weight_qmax, profile.depthwise_weight_qmax) == (
        "int8",
        63,
        127,
    )
    assert note.startswith("weights limited to +-63 (7-bit): reduce_range set in the config")
    assert "depthwise convs keep +-127" in note


def test_a_class_whose_storage_type_the_kernels_do_not_take_gets_7_bit_weights():
    int8_only = PROFILES["onnxruntime"].replace(stored_weight_dtypes=frozenset({"int8"}))
    profile, note = tune_profile(
        int8_only, ProfileOptions("onnxruntime", False, None, "x86-avx2", None)
    )
    assert (profile.weight_dtype, profile.weight_qmax) == ("int8", 63)
    assert note.startswith("weights limited to +-63 (7-bit): the target CPU class x86-avx2")


@pytest.mark.parametrize("target", ["x86-vnni", "arm64", "arm64-dot", "other"])
def test_cpus_without_int16_pair_sums_get_8_bit_weights(target):
    profile, note = tuned("onnxruntime", None, target)
    assert (profile.target_cpu, profile.weight_qmax, profile.depthwise_weight_qmax) == (
        target,
        127,
        None,
    )
    assert profile.weight_dtype == "int8" and note == ""


def test_reduce_range_overrides_the_class():
    profile, note = tuned("onnxruntime", True, "x86-vnni")
    assert profile.weight_qmax == 63 and "reduce_range set in the config" in note
    profile, note = tuned("onnxruntime", False, "x86-avx2")
    assert profile.weight_qmax == 127 and note == ""


def test_the_shipped_tables_say_where_they_were_measured():
    assert set(SHIPPED) == {"x86-avx2", "x86-vnni", "arm64", "arm64-dot", "other"}
    assert "AMD EPYC" in SHIPPED["x86-vnni"].measured_on
    assert all("not measured" in SHIPPED[c].measured_on for c in SHIPPED if c != "x86-vnni")
    profile, _ = tuned("onnxruntime", None, "x86-vnni")
    for name, value in SHIPPED["x86-vnni"].thresholds().items():
        assert getattr(profile, name) == value


def _table(tmp_path, cpu="x86-avx2", **changes) -> str:
    table = CostTable(
        **{
            **SHIPPED["x86-vnni"].__dict__,
            "cpu": cpu,
            "measured_on": "a test",
            "min_macs_per_output": 7,
            **changes,
        }
    )
    path = tmp_path / "table.json"
    path.write_text(table.to_json(), encoding="utf-8")
    return str(path)


def test_a_cost_table_file_sets_the_thresholds_and_the_class(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "x86-vnni")
    path = _table(tmp_path)
    profile, note = tuned("onnxruntime", None, None, path)
    assert (profile.target_cpu, profile.min_macs_per_output) == ("x86-avx2", 7)
    assert profile.cost_table == "table.json: a test"  # no folder: the report has no paths
    assert profile.weight_dtype == "uint8" and note == ""
    profile, note = tuned("onnxruntime", True, None, path)
    assert "reduce_range set in the config" in note and profile.weight_qmax == 63
    with pytest.raises(
        ConfigError, match="measured on the class x86-avx2 but target_cpu is x86-vnni"
    ):
        tuned("onnxruntime", None, "x86-vnni", path)


def _separable_weights(
    target: str, reduce_range: bool | None = None, **options: object
) -> tuple[onnxq.QuantizedModel, dict[str, int]]:
    model = ir.infer_shapes(net(SEPARABLE))
    result = onnxq.quantize(
        model,
        graphs.random_batches(model, 4),
        backend="onnxruntime",
        target_cpu=target,
        reduce_range=reduce_range,
        progress=False,
        **options,
    )
    bits = {p.tensor: p.bits for p in result.report.placed if p.kind == "weight"}
    return result, bits


def test_7_bit_weights_are_recorded_as_7_bits_and_stored_within_63():
    # the report said 8 bits for them, and the fuzz property "scale x qmax <= max |w|" with
    # qmax from those bits failed on every CPU without int8 dot products
    result, bits = _separable_weights("x86-avx2", reduce_range=True)
    assert bits == {"l0.w": 7, "l2.w": 8, "l4.w": 7}  # l2 is the depthwise conv
    stored = {
        t.name: np.abs(numpy_helper.to_array(t).astype(np.int32)).max()
        for t in result.model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("_quantized")
    }
    assert {k.split("_quantized")[0]: v for k, v in stored.items()} == {
        "l0.w": 63,
        "l2.w": 127,
        "l4.w": 63,
    }
    records = read_metadata(result.model)
    assert records is not None and records["l0.w"]["bits"] == 7 and records["l2.w"]["bits"] == 8
    assert read_target_cpu(result.model) == "x86-avx2"
    report = json.loads(result.report.to_json())
    assert report["target_cpu"]["class"] == "x86-avx2"
    assert (report["target_cpu"]["weight_bits"], report["target_cpu"]["depthwise_weight_bits"]) == (
        7,
        8,
    )
    assert {t["tensor"]: t["bits"] for t in report["quantized_tensors"]}["l0.w"] == 7
    assert "tuned for CPU class x86-avx2: 7-bit weights, depthwise convs 8-bit" in (
        result.report.summary()
    )
    (out,) = result.report.fidelity
    assert out.cosine > 0.999  # fused: the 7-bit output is exact on every CPU


def _dequantized_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Each weight DequantizeLinear's values, by the float weight's name."""
    g = ir.Graph(model)
    out = {}
    for node in g.nodes:
        stored = g.const_value(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if stored is None or not node.input[0].endswith("_quantized") or stored.ndim < 2:
            continue
        scale, zero = (g.const_value(t) for t in node.input[1:])
        assert scale is not None and zero is not None
        shape = [1] * stored.ndim
        shape[int(ir.node_attrs(node).get("axis", 1))] = -1
        centred = stored.astype(np.float32) - zero.reshape(shape).astype(np.float32)
        out[node.input[0].split("_quantized")[0]] = centred * scale.reshape(shape)
    return out


def test_uint8_weights_dequantize_to_the_int8_weights_of_a_cpu_with_int8_dot_products():
    avx2, bits = _separable_weights("x86-avx2")
    vnni, _ = _separable_weights("x86-vnni")
    assert bits == {"l0.w": 8, "l2.w": 8, "l4.w": 8}
    types = {
        t.name.split("_quantized")[0]: t.data_type
        for t in avx2.model.graph.initializer
        if t.name.endswith("w_quantized")
    }
    assert types == dict.fromkeys(["l0.w", "l2.w", "l4.w"], onnx.TensorProto.UINT8)
    mine, theirs = _dequantized_weights(avx2.model), _dequantized_weights(vnni.model)
    assert sorted(mine) == ["l0.w", "l2.w", "l4.w"]
    for name, values in mine.items():
        np.testing.assert_array_equal(values, theirs[name])
    records = read_metadata(avx2.model)
    assert records is not None and all(records[w]["symmetric"] for w in mine)
    report = json.loads(avx2.report.to_json())
    assert report["target_cpu"]["weight_dtype"] == "uint8"
    assert "weight_dtype" not in json.loads(vnni.report.to_json())["target_cpu"]
    assert "8-bit weights stored as uint8 (onnxruntime's u8 x u8 kernels" in avx2.report.summary()
    skip_unless_fused_numerics_here("x86-vnni")
    assert [o.cosine for o in avx2.report.fidelity] == [o.cosine for o in vnni.report.fidelity]


def test_8_bit_weights_for_a_cpu_with_int8_dot_products():
    result, bits = _separable_weights("x86-vnni")
    assert bits == {"l0.w": 8, "l2.w": 8, "l4.w": 8}
    assert read_target_cpu(result.model) == "x86-vnni"


@pytest.mark.parametrize("machine", ["x86-avx2", "x86-vnni"])
def test_a_tensorrt_output_does_not_depend_on_the_machine(monkeypatch, machine):
    model = graphs.conv_relu()
    monkeypatch.setenv(ENV_VAR, machine)
    result = onnxq.quantize(model, graphs.random_batches(model, 4), progress=False)
    assert read_target_cpu(result.model) is None
    assert "target_cpu" not in json.loads(result.report.to_json())
    monkeypatch.setenv(ENV_VAR, "arm64")
    again = onnxq.quantize(model, graphs.random_batches(model, 4), progress=False)
    assert ir.serialize(again.model) == ir.serialize(result.model)


@pytest.mark.parametrize(
    ("tuned", "here", "says"),
    [
        ("x86-vnni", "x86-avx2", "int16 sums that such weights overflow"),
        ("x86-avx2", "x86-vnni", "it runs correctly here, but its weights are stored as uint8"),
        ("x86-vnni", "arm64-dot", "follow x86-vnni's cost table, so it may run slower here"),
        ("x86-vnni", "x86-vnni", None),
    ],
)
def test_check_says_when_this_machine_is_not_the_class_the_model_was_tuned_for(
    monkeypatch, tmp_path, capsys, tuned, here, says
):
    result, _ = _separable_weights(tuned)
    path = tmp_path / "q.onnx"
    result.save(path)
    monkeypatch.setenv(ENV_VAR, here)
    message = target_mismatch(read_target_cpu(result.model), here)
    assert main(["check", str(path), "--backend", "onnxruntime"]) == 0
    printed = capsys.readouterr().out
    if says is None:
        assert message is None and "tuned for" not in printed
        return
    assert message is not None and says in message
    assert f"this model was tuned for CPU class {tuned}, this machine is {here}" in message
    assert f"--target-cpu {here}" in message
    assert f"note: {message}" in printed


def test_no_mismatch_without_a_known_recorded_class():
    assert target_mismatch(None, "x86-avx2") is None  # not an onnxruntime output of onnxq's
    assert target_mismatch("riscv-v", "x86-avx2") is None  # a class this onnxq does not know


def test_the_cli_takes_the_target_and_the_table(tmp_path, model_file, calib_dir, capsys):
    model = ir.infer_shapes(net(SEPARABLE))
    path, calib = model_file(model), calib_dir(model)
    high = _table(tmp_path, cpu="x86-vnni", min_macs_per_output=1000)
    assert main(["explain", str(path), "--backend", "onnxruntime", "--cost-table", high]) == 0
    assert "(< min_macs_per_output=1000)" in capsys.readouterr().out
    out = tmp_path / "q.onnx"
    args = ["quantize", str(path), "-o", str(out), "--calib", str(calib)]
    assert main([*args, "--backend", "onnxruntime", "--target-cpu", "x86-avx2"]) == 0
    assert "tuned for CPU class x86-avx2: 8-bit weights stored as uint8" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    assert "tuned for CPU class x86-avx2 (onnxruntime)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # argparse lists the classes
        main([*args, "--target-cpu", "x86-avx3"])
    assert usage.value.code == 2 and "choose from 'x86-avx2'" in capsys.readouterr().err


def test_dynamic_kernels_get_7_bit_int8_weights_where_the_class_stores_uint8():
    # DynamicQuantizeMatMul takes u8 x s8 only: the static kernels' uint8 storage is no way out
    options = ProfileOptions("onnxruntime", True, None, "x86-avx2", None)
    profile, note = profile_for(options)
    assert (profile.weight_dtype, profile.weight_qmax, profile.min_macs) == ("int8", 63, 0)
    assert "7-bit" in note


def test_adaround_integers_are_stored_as_uint8_where_the_class_stores_uint8():
    # the learned integers go into the class's storage like round-to-nearest ones
    avx2, _ = _separable_weights("x86-avx2", adaround=True, adaround_steps=20)
    vnni, _ = _separable_weights("x86-vnni", adaround=True, adaround_steps=20)
    stored = {
        t.name: t.data_type for t in avx2.model.graph.initializer if t.name.endswith("w_quantized")
    }
    assert stored and set(stored.values()) == {onnx.TensorProto.UINT8}
    mine, theirs = _dequantized_weights(avx2.model), _dequantized_weights(vnni.model)
    assert sorted(mine) == sorted(theirs)
    for name, values in mine.items():
        np.testing.assert_array_equal(values, theirs[name])
