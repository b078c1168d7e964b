"""Build small recurrent keyword-spotting models (GRU, CRNN, LSTM) for the dynamic benchmark.

Google-speech-commands-style keyword spotters (Rybakov et al., "Streaming keyword spotting on
mobile devices", 2020: GRU and CRNN models over 40 log-mel bins x 49 frames of 20 ms), trained
for a minute on a synthetic 12-keyword task so that their weights and activations have the
shape trained weights have, then exported with torch 2.13.0 (TorchScript exporter, opset 17,
dynamic batch axis).  Nothing is downloaded.  Writes, under OUT (default
``~/.cache/onnxq-zoo/recurrent``):

  <name>.onnx              gru_kws, crnn_kws (Conv1d + GRU + per-frame Linear), lstm_kws
  <name>.calib/NNNN.npz    64 calibration batches of 8 utterances ({"features": [8, 49, 40]})
  eval.npz                 512 held-out utterances: features [512, 49, 40], labels [512]

    python scripts/make_gru_kws.py [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

FRAMES, BINS, CLASSES = 49, 40, 12
DEFAULT_OUT = Path.home() / ".cache" / "onnxq-zoo" / "recurrent"


def utterances(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic utterances: each keyword is three "syllables" (bands of energy at
    keyword-specific mel bins) at a random onset and speed, over a random noise floor, as log
    energies; returns features [n, 49, 40] float32 and labels [n]."""
    r = np.random.default_rng(seed)
    labels = r.integers(0, CLASSES, n)
    bins = np.arange(BINS)
    feats = np.empty((n, FRAMES, BINS), np.float32)
    for i, label in enumerate(labels):
        k = np.random.default_rng(1000 + int(label))  # the keyword's own syllables
        centres, widths = k.uniform(4, 36, 3), k.uniform(1.5, 4.0, 3)
        energy = np.full((FRAMES, BINS), r.uniform(1e-3, 1e-2))
        onset, length = r.integers(2, 14), r.integers(7, 11)
        for s in range(3):
            start = onset + s * length
            band = np.exp(-0.5 * ((bins - centres[s] - r.normal(0, 1)) / widths[s]) ** 2)
            energy[start : start + length] += r.uniform(0.5, 2.0) * band
        energy *= np.exp(r.normal(0, 0.2, energy.shape))
        feats[i] = np.log(energy + 1e-6)
    return feats, labels


def build(kind: str):  # -> torch.nn.Module
    """One keyword spotter: ``gru_kws``, ``crnn_kws`` or ``lstm_kws``."""
    import torch
    from torch import nn

    class KeywordSpotter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = (
                nn.Sequential(nn.Conv1d(BINS, 64, 5, padding=2), nn.ReLU())
                if kind != "gru_kws"
                else None
            )
            cell = nn.LSTM if kind == "lstm_kws" else nn.GRU
            layers = 2 if kind == "gru_kws" else 1
            self.rnn = cell(64 if self.conv else BINS, 128, layers, batch_first=True)
            self.frame = nn.Sequential(nn.Linear(128, 256), nn.ReLU())
            self.head = nn.Linear(256, CLASSES)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            x = features
            if self.conv is not None:
                x = self.conv(x.transpose(1, 2)).transpose(1, 2)
            x, _ = self.rnn(x)
            return self.head(self.frame(x).mean(dim=1))

    torch.manual_seed(0)
    return KeywordSpotter()


def train(model, steps: int = 400) -> float:
    """Adam on fresh synthetic batches; returns the accuracy on 512 held-out utterances."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        x, y = utterances(64, seed=10_000 + step)
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x, y = utterances(512, seed=1)
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def export(model, path: Path) -> None:
    import torch

    example = torch.from_numpy(utterances(2, seed=2)[0])
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=["features"],
        output_names=["logits"],
        dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


def main(out: Path = DEFAULT_OUT) -> None:
    """Build, train and export the three models with their calibration and eval data."""
    out.mkdir(parents=True, exist_ok=True)
    features, labels = utterances(512, seed=1)
    np.savez(out / "eval.npz", features=features, labels=labels)
    for kind in ("gru_kws", "crnn_kws", "lstm_kws"):
        model = build(kind)
        accuracy = train(model)
        export(model, out / f"{kind}.onnx")
        calib = out / f"{kind}.calib"
        calib.mkdir(exist_ok=True)
        for i in range(64):
            np.savez(calib / f"{i:04d}.npz", features=utterances(8, seed=100 + i)[0])
        print(f"{kind}: held-out accuracy {accuracy:.3f} -> {out / f'{kind}.onnx'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
