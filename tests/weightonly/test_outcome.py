"""What a weight-only run's layers have to say (``onnxq.weightonly.outcome``)."""

from __future__ import annotations

from onnxq.numerics.blocks import BlockFormat
from onnxq.weightonly.outcome import SharedWeight, accuracy_level, shared_weights, short_blocks
from onnxq.weightonly.targets import Layer

INT4_32 = BlockFormat(4, 32, True)


def layer(node: str, k: int, fmt: BlockFormat = INT4_32) -> Layer:
    return Layer(node, "MatMul", f"{node}.w", f"{node}.x", k, 64, False, fmt, "rtn", "default")


def test_a_shared_weight_is_named_with_its_readers_and_format():
    (note,) = shared_weights([SharedWeight("emb", ("embed", "lm_head"), INT4_32)])
    assert note.startswith(
        "weight 'emb' is read by 2 layers (embed, lm_head): stored once as int4 sym block 32"
    )


def test_short_blocks_counts_the_layers_the_block_size_does_not_divide():
    assert short_blocks([layer("a", 64), layer("b", 8, BlockFormat(8, None, True))]) == []
    (note,) = short_blocks([layer("a", 64), layer("b", 70), layer("c", 33)])
    assert note.startswith("2 layer(s) have an input size that the block size does not divide")
    assert "(first: b)" in note


def test_accuracy_level_says_what_level_4_computes_with():
    assert accuracy_level(None) == []
    assert accuracy_level(1) == ["MatMulNBits accuracy_level 1"]
    assert accuracy_level(4) == [
        "MatMulNBits accuracy_level 4: onnxruntime computes with int8-quantized activations"
    ]
