"""Sensitivity trials as executor tasks: what a trial carries, and that a trial scores the same
after its context and argument travel (pickled, as to a Ray worker) as in this process."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import onnxq
from onnxq.scale import InProcess
from tests import graphs
from tests.mixed.test_search import conv_chain


class Travelling:
    """An executor that pickles what a remote worker would receive (the context once, each
    shard) and what it would send back (each result), and records the calls."""

    def __init__(self) -> None:
        self.inner = InProcess()
        self.parallelism, self.shard_batches = 2, None
        self.calls: list[tuple[str, int, list[int], list[int]]] = []  # task, context, sizes

    def map(self, task: Any, setup: Any, context: Any, shards: Any) -> Iterator[Any]:
        sent = pickle.dumps(context)
        call = (task.__name__, len(sent), [], [])
        self.calls.append(call)
        remote = pickle.loads(sent)

        def travelled() -> Iterator[Any]:
            for shard in shards:
                data = pickle.dumps(shard)
                call[2].append(len(data))
                yield pickle.loads(data)

        for result in self.inner.map(task, setup, remote, travelled()):
            data = pickle.dumps(result)
            call[3].append(len(data))
            yield pickle.loads(data)


def quantized(model: Any, target: Any, executor: Any = None) -> tuple[bytes, str]:
    result = onnxq.quantize(
        model, graphs.random_batches(model, 16), progress=False, target=target, executor=executor
    )
    return result.model.SerializeToString(), result.report.to_json()


def test_trials_that_travel_give_the_bytes_and_the_record_of_one_process():
    model = conv_chain(layers=6)
    for target in ("cosine=0.99999", "cosine=1.5", "sqnr=0"):  # met, missed, met by INT8
        travelling = Travelling()
        assert quantized(model, target, travelling) == quantized(model, target)
        assert [c[0] for c in travelling.calls if c[0] == "score_trial"]


def test_the_ranking_trials_go_together_and_carry_no_weights():
    model = conv_chain(layers=6)
    travelling = Travelling()
    quantized(model, "cosine=0.99999", travelling)
    trials = [call for call in travelling.calls if call[0] == "score_trial"]
    ranking = trials[0]
    assert len(ranking[2]) == 7  # the all-INT8 trial and each of the 6 convs alone: one map
    assert all(len(call[2]) == 1 for call in trials[1:])  # bisection, pruning: one at a time
    weights = sum(init.ByteSize() for init in model.graph.initializer)
    assert ranking[1] > weights  # the context holds the model: it travels once per worker
    assert max(size for call in trials for size in call[2]) < weights / 4
    assert max(size for call in trials for size in call[3]) < 64  # a score, nothing else
