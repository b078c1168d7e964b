"""Build the bundled digits example: a small CNN trained on scikit-learn's handwritten digits.

Writes, relative to the repository root:

* ``examples/digits/digits_cnn.onnx``  -- float32 model, input ``input`` [N,1,8,8], output
  ``logits`` [N,10], dynamic batch axis, opset 17.
* ``examples/digits/calib/0000.npz`` .. ``0015.npz`` -- calibration batches (key ``input``,
  float32 [16,1,8,8]) taken from the training rows.
* ``examples/digits/eval.npz`` -- evaluation set (keys ``input`` float32 [360,1,8,8] and
  ``labels`` int64 [360]).

The data ships inside the scikit-learn wheel (``sklearn.datasets.load_digits``), so no network
access is needed. Rows 0..1436 are used for training (and calibration), rows 1437..1796 for
evaluation; the two never overlap. Training is deterministic (fixed seeds, deterministic
algorithms, a single CPU thread) and the output files are byte-identical across runs on the same
software versions.

Requires ``torch`` (CPU build, e.g. ``pip install torch==2.13.0``), ``scikit-learn``, ``numpy``,
``onnx`` and ``onnxruntime``.

Usage::

    python scripts/make_digits_example.py [--out examples/digits] [--epochs 12]
"""

from __future__ import annotations

import argparse
import io
import shutil
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from sklearn.datasets import load_digits
from torch import nn

SEED = 0
N_TRAIN = 1437  # rows 0..1436 train / calibrate, rows 1437..1796 evaluate
CALIB_BATCH = 16
CALIB_BATCHES = 16
TRAIN_BATCH = 32
LOG_EVERY = 5
UPSAMPLE = 4  # 8x8 -> 32x32 inside the model: enough work per conv for INT8 to pay
REPO_ROOT = Path(__file__).resolve().parent.parent


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(x_train, y_train, x_eval, y_eval)``; inputs float32 [N,1,8,8] in 0..1."""
    digits = load_digits()
    x = (digits.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    assert x.shape == (1797, 1, 8, 8), x.shape
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def save_npz_deterministic(path: Path, **arrays: np.ndarray) -> None:
    """Write an uncompressed ``.npz`` readable by ``np.load`` with fixed zip timestamps.

    ``np.savez`` stamps each member with the current time, so its output differs from run to
    run; this writes the same archive layout with a constant date so reruns are byte-identical.
    """
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


class DigitsNet(nn.Module):
    """Upsample the 8x8 digit 4x (a Resize node in the graph), then six 3x3 Conv+BN+ReLU
    layers in three stages (32, 64, 128 channels, max-pool between), global average pool and
    two Linear layers.  Every conv after the first reads 32+ channels and every op does enough
    multiply-adds that INT8 pays for it on both backends; the first conv reads one channel and
    the last Linear writes ten logits, so they stay float (INT8 does not pay for them)."""

    def __init__(self) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]

        self.features = nn.Sequential(
            *block(1, 32),
            *block(32, 32),
            nn.MaxPool2d(2),
            *block(32, 64),
            *block(64, 64),
            nn.MaxPool2d(2),
            *block(64, 128),
            *block(128, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [N,10] of images [N,1,8,8]."""
        x = nn.functional.interpolate(x, scale_factor=UPSAMPLE, mode="bilinear")
        return self.classifier(self.features(x))


def build_model() -> DigitsNet:
    """The example's network (:class:`DigitsNet`), freshly initialised."""
    return DigitsNet()


def train(x_train: np.ndarray, y_train: np.ndarray, epochs: int) -> DigitsNet:
    """Train the CNN deterministically and return it in eval mode."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)

    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(xt), TRAIN_BATCH):
            idx = perm[i : i + TRAIN_BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        sched.step()
        if (epoch + 1) % LOG_EVERY == 0 or epoch == epochs - 1:
            print(f"epoch {epoch + 1:3d}  train loss {total / len(xt):.4f}")
    print(f"training took {time.perf_counter() - t0:.1f} s")
    return model.eval()


def export_onnx(model: DigitsNet, path: Path) -> None:
    """Export with the TorchScript exporter, opset 17, dynamic batch axis."""
    with warnings.catch_warnings():
        # dynamo=False is deliberate (stable, compact TorchScript export); silence its notice.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        torch.onnx.export(
            model,
            (torch.zeros(1, 1, 8, 8),),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )


def write_data(out: Path, x_train: np.ndarray, x_eval: np.ndarray, y_eval: np.ndarray) -> None:
    """Write the calibration batches (training rows) and the evaluation set."""
    calib_dir = out / "calib"
    if calib_dir.exists():
        shutil.rmtree(calib_dir)
    calib_dir.mkdir()
    for b in range(CALIB_BATCHES):
        rows = x_train[b * CALIB_BATCH : (b + 1) * CALIB_BATCH]
        save_npz_deterministic(calib_dir / f"{b:04d}.npz", input=rows)
    save_npz_deterministic(out / "eval.npz", input=x_eval, labels=y_eval)
    print(f"wrote {CALIB_BATCHES} calibration batches to {calib_dir} and {out / 'eval.npz'}")


def main() -> int:
    """Train, evaluate, export and write the example files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "examples" / "digits")
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()

    x_train, y_train, x_eval, y_eval = load_split()
    model = train(x_train, y_train, args.epochs)
    with torch.no_grad():
        logits = model(torch.from_numpy(x_eval)).numpy()
    acc = float((logits.argmax(1) == y_eval).mean())
    print(f"float test accuracy (torch): {acc:.4f}  ({len(y_eval)} eval rows {N_TRAIN}..1796)")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / "digits_cnn.onnx"
    export_onnx(model, onnx_path)
    write_data(out, x_train, x_eval, y_eval)

    # Cross-check the exported file with onnx + onnxruntime.
    proto = onnx.load(str(onnx_path))
    onnx.checker.check_model(proto)
    ops = sorted({n.op_type for n in proto.graph.node})
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ort_logits = sess.run(["logits"], {"input": x_eval})[0]
    ort_acc = float((ort_logits.argmax(1) == y_eval).mean())
    print(f"exported {onnx_path} ({onnx_path.stat().st_size} bytes), ops: {', '.join(ops)}")
    print(
        f"float test accuracy (onnxruntime): {ort_acc:.4f}, "
        f"max |logit diff| vs torch: {np.abs(ort_logits - logits).max():.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
