"""silero-vad, whose whole network sits in the branches of an ``If`` on the sample rate: what onnxq
quantizes inside the branches, per backend and calibration set, and how close the result stays
to the float model at each rate.

    python scripts/measure_silero_control_flow.py MODEL.onnx CALIB_16K_DIR OUT_DIR
        [--zoo ZOO_DIR] [--config NAME=FILE.yaml ...]

Builds the 8 kHz batches (``scripts/silero_8khz_calibration.py``) into ``OUT_DIR/calib_8k`` and
``OUT_DIR/calib_mixed``, quantizes with the 16 kHz batches alone and with both rates, for
``tensorrt`` and ``onnxruntime`` (and each extra ``--config``), and prints per run: the Convs
quantized in each branch, ``onnxq check``'s verdict and Q/DQ count, and per rate over every
batch of that rate the speech-probability cosine, max |difference| and agreement at 0.5
against the float model (``tensorrt`` outputs run unfused, the Q/DQ graph's own arithmetic,
``onnxruntime`` outputs with its default fused kernels).  With ``--zoo``, the zoo's
evaluation score of each output too (``zoo.py eval``, 16 kHz audio).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

BRANCHES = {"16 kHz": "If_0_then_branch", "8 kHz": "If_0_else_branch"}
NEVER = ("branch never taken", "body never run")


def session(path: Path, fused: bool):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if not fused:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def fidelity(model: Path, quantized: Path, batches: list[Path], fused: bool) -> dict[str, str]:
    """Per sample rate: cosine, max |diff| and agreement at 0.5 of the speech probabilities."""
    ref, got = session(model, fused), session(quantized, fused)
    by_rate: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for path in batches:
        with np.load(path) as data:
            batch = dict(data)
        f, q = by_rate.setdefault(int(batch["sr"]), ([], []))
        f.append(ref.run(None, batch)[0].ravel())
        q.append(got.run(None, batch)[0].ravel())
    out = {}
    for rate, (f_parts, q_parts) in sorted(by_rate.items()):
        f, q = np.concatenate(f_parts).astype(np.float64), np.concatenate(q_parts)
        cos = float(f @ q / np.linalg.norm(f) / np.linalg.norm(q))
        agree = float(np.mean((f > 0.5) == (q > 0.5)))
        out[f"{rate // 1000} kHz"] = (
            f"cos {cos:.5f}, max|d| {np.abs(f - q).max():.3f}, agree@0.5 {agree:.4f}"
        )
    return out


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def zoo_score(zoo: Path, outdir: Path) -> str:
    """The zoo's score of ``outdir/silero_vad.onnx`` (float reference alongside)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "eval.json"
        ref = Path("~/.cache/onnxq-zoo/models").expanduser()
        subprocess.run(
            [
                *(sys.executable, "zoo.py", "eval", "--models", str(outdir)),
                *("--only", "silero_vad", "--ref", str(ref), "--json", str(report)),
            ],
            cwd=zoo,
            check=True,
            capture_output=True,
        )
        r = json.loads(report.read_text())["silero_vad"]
    return f"{r['score']:.4f} (float {r['ref_score']:.4f}, unfused {r['score_unfused']:.4f})"


def run(args: argparse.Namespace, name: str, calib: Path, backend: str, config: str | None):
    import onnxq
    from onnxq import cli

    out = args.out / f"{name}-{backend}".replace(" ", "_") / "silero_vad.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = onnxq.quantize(args.model, calib, backend=backend, config=config, progress=False)
    result.save(out)
    convs = [d.node for d in result.report.quantized_ops if d.op_type == "Conv"]
    total = {
        rate: sum(tag in d.node for d in result.report.decisions if d.op_type == "Conv")
        for rate, tag in BRANCHES.items()
    }
    line = {rate: f"{sum(tag in c for c in convs)}/{total[rate]}" for rate, tag in BRANCHES.items()}
    code = cli.main(["check", str(out), "--backend", backend])
    batches = sorted(args.out.joinpath("calib_mixed").glob("*.npz"))
    print(
        f"\n{name}, --backend {backend}: {len(result.report.quantized_ops)} ops quantized, "
        f"Convs 16 kHz {line['16 kHz']}, 8 kHz {line['8 kHz']}; check exit {code}"
    )
    for rate, text in fidelity(args.model, out, batches, backend == "onnxruntime").items():
        print(f"  {rate}: {text}")
    idle = [d for d in result.report.float_ops if d.reason.startswith(NEVER)]
    outer = sorted({d.reason for d in idle if "'If_0')" in d.reason})
    print(
        f"  {len(idle)} ops float in branches never taken" + (f", e.g. {outer[0]}" if outer else "")
    )
    if args.zoo:
        print(f"  zoo score: {zoo_score(args.zoo, out.parent)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("calib", type=Path, help="folder of 16 kHz .npz batches")
    parser.add_argument("out", type=Path)
    parser.add_argument("--zoo", type=Path, help="the zoo's folder (zoo.py), for its score")
    parser.add_argument("--config", action="append", default=[], help="NAME=FILE.yaml")
    args = parser.parse_args()
    import onnxruntime

    print(f"CPU: {cpu_name()}, onnxruntime {onnxruntime.__version__}")
    for mixed in (False, True):
        folder = args.out / ("calib_mixed" if mixed else "calib_8k")
        cmd = [
            sys.executable,
            str(ROOT / "scripts" / "silero_8khz_calibration.py"),
            str(args.model),
            str(args.calib),
            str(folder),
        ] + (["--mixed"] if mixed else [])
        subprocess.run(cmd, check=True, capture_output=True)
    configs = [("", None)] + [tuple(c.split("=", 1)) for c in args.config]
    for tag, config in configs:
        for name, calib in (("16k", args.calib), ("16k+8k", args.out / "calib_mixed")):
            for backend in ("tensorrt", "onnxruntime"):
                run(args, name + (f" {tag}" if tag else ""), calib, backend, config)


if __name__ == "__main__":
    main()
