"""Train a tiny ResNet-like CNN on scikit-learn's digits, quantize it with onnxq.quantize_torch.

No downloads: the digits ship inside the scikit-learn wheel.  Rows 0..1436 train the model and
calibrate it; rows 1437..1796 are held out for the accuracy comparison.

    pip install 'onnxq[torch]' scikit-learn
    python examples/pytorch/quantize_resnet_like.py --out out/

Writes ``OUT/resnet_like.int8.onnx`` and its report ``OUT/resnet_like.int8.json``; prints float
and INT8 accuracy and exits 1 if INT8 loses more than ``--max-drop`` points.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from sklearn.datasets import load_digits
from torch import nn

import onnxq

N_TRAIN = 1437


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn plus the (projected) input, then relu: a ResNet basic block."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.downsample(x))


class ResNetLike(nn.Module):
    """Stem, two stages of basic blocks, global average pool, linear classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.layer1 = nn.Sequential(BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, stride=2))
        self.fc = nn.Linear(32, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(image)))
        return self.fc(x.mean((2, 3)))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int) -> None:
    """Adam with a cosine schedule, batches of 32, a fixed shuffling seed."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 32):
            idx = perm[i : i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        sched.step()
    model.eval()


def main() -> int:
    """Train, quantize, save, compare accuracy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--backend", choices=("tensorrt", "onnxruntime"), default="tensorrt")
    parser.add_argument(
        "--max-drop",
        type=float,
        default=1.0,
        help="largest accepted INT8 accuracy loss in points (default 1.0)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    digits = load_digits()
    images = (digits.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    x_train, y_train = torch.from_numpy(images[:N_TRAIN]), torch.from_numpy(labels[:N_TRAIN])
    x_eval, y_eval = images[N_TRAIN:], labels[N_TRAIN:]

    start = time.perf_counter()
    model = ResNetLike()
    train(model, x_train, y_train, args.epochs)
    with torch.no_grad():
        float_acc = float((model(torch.from_numpy(x_eval)).argmax(1).numpy() == y_eval).mean())
    print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s")

    # Calibration: the training rows. Items are (image, label) pairs; quantize_torch takes the
    # first element (the model has one input) and ignores the label.
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train), batch_size=64
    )
    result = onnxq.quantize_torch(model, x_train[:2], loader, backend=args.backend, progress=False)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "resnet_like.int8.onnx"
    result.save(path, report=args.out / "resnet_like.int8.json")
    print(result.report.summary())

    options = ort.SessionOptions()
    if args.backend == "tensorrt":  # the Q/DQ graph's own arithmetic, as TensorRT computes it
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    logits = session.run(None, {"image": x_eval})[0]
    int8_acc = float((logits.argmax(1) == y_eval).mean())
    print(f"float accuracy {float_acc:.4f}")
    print(f"int8 accuracy  {int8_acc:.4f}   ({len(y_eval)} held-out rows, {args.backend})")
    print(f"wrote {path}")
    return 0 if int8_acc >= float_acc - args.max_drop / 100 else 1


if __name__ == "__main__":
    raise SystemExit(main())
