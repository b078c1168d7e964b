"""The layer-by-layer engine: its numpy math runs with one BLAS thread."""

from __future__ import annotations

from threadpoolctl import threadpool_info

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.config.recipes import WeightOnlyRecipe
from onnxq.runtime.blas import BLAS_THREADS
from onnxq.weightonly import engine
from onnxq.weightonly.layers import resolve_algorithm
from onnxq.weightonly.targets import find_layers
from tests.weightonly import models


def _blas_threads() -> set[int]:
    return {int(x["num_threads"]) for x in threadpool_info() if x["user_api"] == "blas"}


def test_layer_groups_are_quantized_with_one_blas_thread_and_the_limit_is_lifted_after(
    monkeypatch,
):
    model = models.decoder()
    recipe = QuantConfig(weight_only="int4", block_size=32).recipe()
    assert isinstance(recipe, WeightOnlyRecipe)
    layers, _ = find_layers(
        ir.Graph(model), PROFILES["onnxruntime"], recipe.weightonly, recipe.placement
    )
    layers = [resolve_algorithm(x, True) for x in layers]
    seen: list[set[int]] = []
    quantize_group = engine._quantize_group

    def recording(*args):
        seen.append(_blas_threads())
        return quantize_group(*args)

    monkeypatch.setattr(engine, "_quantize_group", recording)
    before = _blas_threads()
    out = engine.quantize_layers(model, layers, models.token_batches())
    assert set(out) == {x.node for x in layers}
    assert len(seen) == 3  # gate/up, down, the head (the embedding needs no data)
    assert all(s == {BLAS_THREADS} for s in seen)
    assert _blas_threads() == before
