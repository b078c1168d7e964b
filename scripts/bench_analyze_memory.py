"""Peak memory of `onnxq analyze` against `onnxq quantize` on one model.

Each run is a fresh Python process (its own peak RSS, from getrusage): quantize MODEL with the
calibration data, then analyze MODEL against the result on the same batches, at the default
memory budget and at the smaller budgets given.  analyze holds the float model and two copies
of the quantized one in one onnxruntime session and exposes their tensors in groups that fit
the budget, as calibration does; the table shows what that costs against quantize.

    python scripts/bench_analyze_memory.py ~/.cache/onnxq-zoo/models/ppocrv4_det.onnx \
        --calib ~/.cache/onnxq-zoo/calib/ppocrv4_det --max-batches 4 --budgets 256 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from onnxq.cli import main
start = time.perf_counter()
code = main(sys.argv[1:])
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "seconds": time.perf_counter() - start, "peak_mb": peak_kb / 1024}))
"""


def run(args: list[str]) -> dict[str, float]:
    """Run ``onnxq ARGS`` in a fresh process; its exit code, seconds and peak RSS (MB)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if not last.startswith("{"):
        sys.exit(f"onnxq {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return json.loads(last)


def main() -> None:
    """Measure and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--calib", required=True)
    p.add_argument("--backend", default="tensorrt")
    p.add_argument("--max-batches", type=int, default=4)
    p.add_argument("--budgets", type=int, nargs="*", default=[256], metavar="MB")
    a = p.parse_args()
    import onnxruntime

    print(
        f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"onnxruntime {onnxruntime.__version__}; model {Path(a.model).name}, "
        f"{a.max_batches} batches"
    )
    with tempfile.TemporaryDirectory() as tmp:
        quant = str(Path(tmp) / "q.onnx")
        common = ["--calib", a.calib, "--max-batches", str(a.max_batches)]
        q = run(["quantize", a.model, "-o", quant, "--backend", a.backend, "-q", *common])
        rows = [("quantize", q)]
        rows.append(("analyze (default budget 4096 MB)", run(["analyze", a.model, quant, *common])))
        for mb in a.budgets:
            args = ["analyze", a.model, quant, *common, "--memory-budget", str(mb)]
            rows.append((f"analyze --memory-budget {mb}", run(args)))
    print(f"{'run':<36} {'peak RSS MB':>12} {'x quantize':>11} {'seconds':>8}")
    for name, r in rows:
        print(
            f"{name:<36} {r['peak_mb']:>12.0f} {r['peak_mb'] / q['peak_mb']:>11.2f} "
            f"{r['seconds']:>8.1f}"
        )


if __name__ == "__main__":
    main()
