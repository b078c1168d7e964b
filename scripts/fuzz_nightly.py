"""Nightly fuzzing of ``onnxq.quantize`` on random valid graphs: the property of
``tests/test_fuzz.py`` for thousands of examples, with a fresh random seed each night.

Usage::

    python scripts/fuzz_nightly.py --examples 5000 [--seed S] [--backend tensorrt ...]
                                   [--artifacts DIR] [--max-ops 8] [--hang-timeout 300]

For every generated model and backend the outcome is one of: ``ok`` (a valid, conforming model
within the error bound), ``ok-flip`` (an If branch legitimately flipped), an ``OnnxqError``
(grouped by message), or a *failure*: any other exception (``InternalError`` included), a result
that breaks the property, or a crash/hang of the process (onnxruntime aborts on some graphs).

The examples run in a worker process; the parent restarts it (with a new seed) after a crash or
a hang, so one native abort does not end the night.  Failing models are saved to
``--artifacts`` with a JSON note (backend, message, traceback, seeds) for replay.  Prints the
counts; exit status 1 on any failure, 0 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- the worker
def worker(args: argparse.Namespace) -> int:
    """Run ``args.examples`` examples; one JSON line per outcome to ``args.worker_log``."""
    sys.path.insert(0, str(ROOT))
    import onnx
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from onnxq import InternalError
    from tests.fuzzgraphs import FuzzCase, fuzz_cases
    from tests.test_fuzz import PropertyViolation, error_stem, quantize_property

    args.artifacts.mkdir(parents=True, exist_ok=True)
    current = args.artifacts / f"current-{os.getpid()}.onnx"
    log = open(args.worker_log, "a", buffering=1)  # noqa: SIM115 - line-buffered for the parent

    def emit(**record: object) -> None:
        log.write(json.dumps(record) + "\n")

    def save_failure(case: FuzzCase, backend: str, kind: str, exc: BaseException) -> None:
        stamp = f"{args.seed}-{time.time_ns() % 10**9:09d}-{backend}"
        path = args.artifacts / f"failure-{stamp}.onnx"
        onnx.save(case.model, str(path))
        note = {
            "backend": backend,
            "kind": kind,
            "stem": f"{kind}: {error_stem(exc)}",
            "message": f"{type(exc).__name__}: {exc}",
            "case": repr(case),
            "batch_seed": case.seed,
            "hypothesis_seed": args.seed,
            "model": str(path),
            "traceback": "".join(traceback.format_exception(exc)),
        }
        path.with_suffix(".json").write_text(json.dumps(note, indent=2) + "\n")
        emit(
            event="outcome",
            backend=backend,
            kind="FAILURE",
            **{k: note[k] for k in ("stem", "message", "case", "model")},
        )

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=fuzz_cases(max_ops=args.max_ops))
    def explore(case: FuzzCase) -> None:
        for backend in args.backend:
            onnx.save(case.model, str(current))  # survives a native crash
            current.with_suffix(".json").write_text(
                json.dumps({"backend": backend, "case": repr(case), "batch_seed": case.seed})
            )
            try:
                outcome = quantize_property(case, backend)
            except PropertyViolation as exc:
                save_failure(case, backend, "property violated", exc)
            except InternalError as exc:
                save_failure(case, backend, "InternalError", exc)
            except Exception as exc:  # any other exception type is a bug too
                save_failure(case, backend, "unexpected exception", exc)
            else:
                emit(
                    event="outcome",
                    backend=backend,
                    kind=outcome.kind,
                    stem=outcome.detail,
                    worst=outcome.worst_rel_error,
                    qdq=outcome.qdq_nodes,
                )
                if outcome.kind == "ok-ill-conditioned":  # keep a few for reviewing the oracle
                    ill = args.artifacts / "ill-conditioned"
                    ill.mkdir(exist_ok=True)
                    if len(list(ill.glob("*.onnx"))) < 50:
                        path = ill / f"{args.seed}-{time.time_ns() % 10**9:09d}-{backend}.onnx"
                        onnx.save(case.model, str(path))
                        path.with_suffix(".json").write_text(
                            json.dumps(
                                {
                                    "backend": backend,
                                    "case": repr(case),
                                    "batch_seed": case.seed,
                                    "detail": outcome.detail,
                                },
                                indent=2,
                            )
                            + "\n"
                        )
        emit(event="example")

    explore()
    current.unlink(missing_ok=True)
    current.with_suffix(".json").unlink(missing_ok=True)
    emit(event="done")
    return 0


# ------------------------------------------------------------------------------- the parent
class Tally:
    def __init__(self, backends: list[str]):
        self.counts = {b: collections.Counter() for b in backends}
        self.errors = {b: collections.Counter() for b in backends}
        self.worst = dict.fromkeys(backends, 0.0)
        self.with_qdq = collections.Counter()
        self.failures: list[dict] = []
        self.examples = 0

    def add(self, rec: dict) -> None:
        if rec["event"] == "example":
            self.examples += 1
            return
        if rec["event"] != "outcome":
            return
        b, kind = rec["backend"], rec["kind"]
        self.counts[b][kind] += 1
        if kind == "FAILURE":
            self.failures.append(rec)
        elif kind == "onnxq-error":
            self.errors[b][rec["stem"]] += 1
        else:
            self.worst[b] = max(self.worst[b], rec["worst"])
            self.with_qdq[b] += rec["qdq"] > 0


def run_worker(args: argparse.Namespace, examples: int, seed: int, log: Path, tally: Tally) -> str:
    """One worker run, fed into ``tally``; returns how it ended: done, crash or hang."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker-log",
        str(log),
        "--examples",
        str(examples),
        "--seed",
        str(seed),
        "--artifacts",
        str(args.artifacts),
        "--max-ops",
        str(args.max_ops),
    ]
    for b in args.backend:
        cmd += ["--backend", b]
    log.write_text("")
    tmpdir = args.artifacts / "tmp"  # a native abort skips onnxq's temp-dir cleanup
    tmpdir.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    read = 0
    last_progress = time.monotonic()
    finished = False

    def consume() -> None:
        nonlocal read, last_progress, finished
        text = log.read_text()
        lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
        for line in lines[read:]:
            rec = json.loads(line)
            tally.add(rec)
            finished |= rec["event"] == "done"
            if rec["event"] == "example" and tally.examples % 100 == 0:
                print(
                    f"  {tally.examples} models, {len(tally.failures)} failures",
                    file=sys.stderr,
                    flush=True,
                )
        if len(lines) > read:
            last_progress = time.monotonic()
        read = len(lines)

    ended = ""
    while not ended:
        time.sleep(0.5)
        exited = proc.poll() is not None
        consume()
        if finished:
            ended = "done"
        elif exited:
            ended = "crash"
        elif time.monotonic() - last_progress > args.hang_timeout:
            proc.kill()
            ended = "hang"
    _, err = proc.communicate()
    if ended == "done" and proc.returncode != 0:
        ended = "crash"
    if ended != "done":
        record_crash(args, ended, proc.returncode, err, tally)
    return ended


def record_crash(
    args: argparse.Namespace, how: str, code: int | None, stderr: str, tally: Tally
) -> None:
    current = sorted(args.artifacts.glob("current-*.onnx"))
    note: dict = {"backend": "?", "case": "?"}
    model = ""
    if current:
        meta = current[-1].with_suffix(".json")
        if meta.exists():
            note = json.loads(meta.read_text())
        target = args.artifacts / f"{how}-{time.time_ns() % 10**9:09d}.onnx"
        shutil.move(str(current[-1]), target)
        meta.unlink(missing_ok=True)
        model = str(target)
    tail = " | ".join(stderr.strip().splitlines()[-3:])[:600]
    tally.failures.append(
        {
            "backend": note["backend"],
            "kind": "FAILURE",
            "model": model,
            "stem": f"process {how} (exit {code})",
            "case": note["case"],
            "message": f"worker {how}, exit {code}: {tail}",
        }
    )
    tally.counts.setdefault(note["backend"], collections.Counter())["FAILURE"] += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=2000, help="models to generate")
    p.add_argument("--seed", type=int, help="hypothesis seed (default: random, printed)")
    p.add_argument(
        "--backend",
        action="append",
        choices=("tensorrt", "onnxruntime", "onnxruntime-nocost"),
        help="backend(s) to test (default all three; onnxruntime-nocost: the "
        "onnxruntime profile without its cost rules, so small graphs get Q/DQ)",
    )
    p.add_argument(
        "--artifacts",
        type=Path,
        default=Path("fuzz-failures"),
        help="folder for failing models (default ./fuzz-failures)",
    )
    p.add_argument("--max-ops", type=int, default=8, help="ops per generated graph")
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=300,
        help="seconds without progress before the worker counts as hung",
    )
    p.add_argument("--show", type=int, default=20, help="message groups to print")
    p.add_argument("--worker-log", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.backend = args.backend or ["tensorrt", "onnxruntime", "onnxruntime-nocost"]
    if args.worker_log is not None:
        return worker(args)

    run_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    tally = Tally(args.backend)
    started = time.monotonic()
    print(
        f"fuzzing {args.examples} models x {', '.join(args.backend)} (seed {run_seed})", flush=True
    )
    log = args.artifacts / f"worker-{os.getpid()}.jsonl"
    restarts = 0
    while tally.examples < args.examples and restarts <= 100:
        seed = run_seed + 7919 * restarts  # a crash must not replay the same sequence
        if run_worker(args, args.examples - tally.examples, seed, log, tally) == "done":
            break
        restarts += 1
    log.unlink(missing_ok=True)
    shutil.rmtree(args.artifacts / "tmp", ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"\n{tally.examples} models in {elapsed:.0f} s ({restarts} worker restarts)")
    for b in args.backend:
        c = tally.counts[b]
        print(
            f"{b}: ok {c['ok']} (with Q/DQ: {tally.with_qdq[b]}), ok past the bound but "
            f"within the noise budget (ill-conditioned) {c['ok-ill-conditioned']}, ok after "
            f"a legitimate If-branch flip {c['ok-flip']}, OnnxqError {c['onnxq-error']}, "
            f"failures {c['FAILURE']}; worst relative L2 error when ok: "
            f"{tally.worst[b]:.4f}"
        )
        for stem, n in tally.errors[b].most_common(args.show):
            print(f"  OnnxqError x{n}: {stem}")
    if tally.failures:
        stems = collections.Counter(f"{f['backend']}: {f['stem']}" for f in tally.failures)
        unique = len({(f["backend"], f["case"]) for f in tally.failures})
        print(
            f"\n{len(tally.failures)} FAILURES on {unique} distinct (model, backend) pairs "
            f"(hypothesis re-tries near an example; models and notes in {args.artifacts}/):"
        )
        for stem, n in stems.most_common(args.show):
            print(f"  x{n}: {stem}")
        first: dict[str, dict] = {}
        for f in tally.failures:
            first.setdefault(f"{f['backend']}: {f['stem']}", f)
        for f in list(first.values())[: args.show]:
            print(f"\n--- {f['model']}\n{f['case']}\n{f['message'][:600]}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
