"""Layer inputs, stage by stage, with the layers before them already quantized.

The model is cut into stages (:mod:`onnxq.ir.stages`), one per group of layers that read the
same input.  The runner keeps, for the calibration batches it was given, the tensors that live
between stages; it runs one stage at a time in onnxruntime, with the weights quantized so far
put in as float values (the dequantized weights: what the quantized model computes), and hands
the stage's targets to the caller batch by batch.  Memory: the live tensors of the kept
batches, the quantized weights not yet used by a stage, and one stage's session; each node
runs once per batch over the whole pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from onnxq.data.inputs import Batch
from onnxq.errors import CalibrationDataError
from onnxq.ir.scratch import scratch_dir
from onnxq.ir.stages import Stage, last_reader, plan_stages, stage_model
from onnxq.runtime.heap import release_free_memory


class LayerwiseRunner:
    """Run ``model`` stage by stage over ``batches``; stage ``k`` produces ``targets[k]``."""

    def __init__(
        self, model: onnx.ModelProto, targets: Sequence[Sequence[str]], batches: list[Batch]
    ):
        if not batches:
            raise CalibrationDataError("layerwise calibration needs at least one batch")
        self.model = model
        self.stages: list[Stage] = plan_stages(model, targets)
        self._last = last_reader(self.stages)
        self._weight_last: dict[str, int] = {}
        for k, stage in enumerate(self.stages):
            for name in stage.initializers:
                self._weight_last[name] = k
        self._store: dict[str, list[np.ndarray]] = {
            name: [b[name] for b in batches] for name in batches[0]
        }
        self._weights: dict[str, np.ndarray] = {}
        self._batches = len(batches)
        self._next = 0

    @property
    def batches(self) -> int:
        """How many batches each stage runs."""
        return self._batches

    def reads_later(self, name: str) -> bool:
        """Whether a stage still to run reads initializer ``name``."""
        return self._weight_last.get(name, -1) >= self._next

    def set_weight(self, name: str, value: np.ndarray) -> None:
        """Use ``value`` for initializer ``name`` in the stages still to run (dropped once the
        last stage that reads it has run; never kept when no later stage reads it)."""
        if self._weight_last.get(name, -1) >= self._next:
            self._weights[name] = value

    def run(self) -> Iterator[dict[str, np.ndarray]]:
        """Run the next stage; yields its targets for each batch, in batch order."""
        k = self._next
        stage = self.stages[k]
        missing = [x for x in stage.inputs if x not in self._store]
        if missing:
            raise CalibrationDataError(
                f"the model reads {missing[0]!r} before layer group {k}, and no calibration "
                "batch holds it (a model input the data lacks)"
            )
        if stage.nodes:
            yield from self._run_session(k, stage)
        else:
            for b in range(self._batches):
                yield {t: self._store[t][b] for t in stage.targets}
        self._next = k + 1
        for x in [x for x in self._store if self._last.get(x, -1) <= k]:
            del self._store[x]
        for x in [x for x in self._weights if self._weight_last[x] <= k]:
            del self._weights[x]

    def _run_session(self, k: int, stage: Stage) -> Iterator[dict[str, np.ndarray]]:
        from onnxq.calibrate.session import make_session

        types = {
            x: int(helper.np_dtype_to_tensor_dtype(self._store[x][0].dtype)) for x in stage.inputs
        }
        sub = stage_model(self.model, stage, types, self._weights)
        keep = [x for x in stage.outputs if self._last.get(x, -1) > k]
        results: dict[str, list[np.ndarray]] = {x: [] for x in keep}
        with scratch_dir("onnxq-stage-") as tmp:
            session = make_session(sub, optimize=True, workdir=Path(tmp))
            del sub
            names = list(stage.outputs)
            for b in range(self._batches):
                feed = {x: self._store[x][b] for x in stage.inputs}
                values = dict(zip(names, session.run(names, feed), strict=True))
                for x in keep:
                    results[x].append(values[x])
                yield {t: values[t] for t in stage.targets}
            del session
        release_free_memory()  # the stage's weights and buffers, freed but kept by the C library
        self._store.update(results)

    def live_bytes(self) -> int:
        """Bytes of the tensors and weights the runner holds between stages now."""
        held = sum(a.nbytes for arrays in self._store.values() for a in arrays)
        return held + sum(w.nbytes for w in self._weights.values())
