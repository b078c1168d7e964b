"""The dynamic rule set: which ops get onnxruntime's dynamic kernels, and why others stay float."""

from __future__ import annotations

from onnxq import ir
from onnxq.annotate import annotate
from onnxq.backends.precision import run_profile
from onnxq.backends.profile import ONNXRUNTIME, TENSORRT
from onnxq.config import QuantConfig
from tests import graphs

CFG = QuantConfig(backend="onnxruntime", dynamic=True)
DYNAMIC = run_profile(ONNXRUNTIME, CFG)


def decisions(model, profile=DYNAMIC, config=CFG):
    ann = annotate(ir.Graph(ir.infer_shapes(model)), profile, config)
    return {d.node: d for d in ann.decisions}, ann


def test_matmuls_with_a_constant_weight_are_claimed_and_attention_scores_are_not():
    found, ann = decisions(graphs.matmul_stack())
    assert found["up"].rule == found["down"].rule == "dynamic_matmul"
    assert not found["scores"].quantized and "activation x activation" in found["scores"].reason
    assert {t.tensor for t in ann.of_kind("weight")} == {"w1", "w2"}
    assert {t.axis for t in ann.of_kind("weight")} == {1}  # per output column


def test_a_small_weight_stays_float_with_the_cost_reason():
    found, _ = decisions(graphs.matmul_stack(k=32, n=32))
    assert not found["up"].quantized
    assert "costs more than it saves" in found["up"].reason


def test_gemm_with_a_per_column_bias_is_claimed():
    found, _ = decisions(graphs.gemm(trans_b=True, k=128, n=64))
    assert found["gemm"].rule == "dynamic_gemm"


def test_an_lstm_is_claimed_and_gru_and_rnn_stay_float_with_the_reason():
    found, ann = decisions(graphs.recurrent("LSTM"))
    assert found["rnn"].rule == "dynamic_lstm"
    assert {t.tensor: t.axis for t in ann.of_kind("weight")}["rnn.R"] == 1
    for cell in ("GRU", "RNN"):
        found, _ = decisions(graphs.recurrent(cell))
        assert not found["rnn"].quantized
        assert "DynamicQuantizeLSTM" in found["rnn"].reason and "GRU and RNN" in found["rnn"].reason
        assert found["fc"].quantized  # the cell stays float, its neighbours do not


def test_a_small_lstm_stays_float():
    found, _ = decisions(graphs.recurrent("LSTM", features=32, hidden=32))
    assert not found["rnn"].quantized and "so small a cell" in found["rnn"].reason
    found, _ = decisions(graphs.recurrent("LSTM", steps=1))  # one step: still quantized
    assert found["rnn"].quantized


def test_a_conv_stays_float_with_the_measured_reason():
    found, _ = decisions(graphs.conv_relu(64, 64))
    assert not found["conv"].quantized and "ConvInteger" in found["conv"].reason


def test_static_backends_say_why_recurrent_cells_stay_float():
    for profile, backend, text in (
        (TENSORRT, "tensorrt", "FP32/FP16/BF16 only"),
        (ONNXRUNTIME, "onnxruntime", "DynamicQuantizeLSTM under --dynamic"),
    ):
        found, _ = decisions(graphs.recurrent("GRU"), profile, QuantConfig(backend=backend))
        assert not found["rnn"].quantized and text in found["rnn"].reason
