"""Build 8 kHz calibration batches for silero-vad from its 16 kHz ones, so that calibration
runs both branches of the model's sample-rate ``If``.

Each 16 kHz row (64 samples of context + 512 new) is low-pass filtered (a windowed-sinc FIR at
3.6 kHz) and decimated by 2: 32 + 256 samples, silero's 8 kHz chunk.  The recurrent state of
each row comes from running the float model at 8 kHz over the rows in order (batch 0 row 0,
row 1, ..., batch 1 row 0, ...), each row starting from the state the previous one left: the
zoo's batches pick evenly spaced steps of the same recordings in that order, so this follows
the audio as a stream would.  The 16 kHz data is only read.

    python scripts/silero_8khz_calibration.py MODEL.onnx CALIB_16K_DIR OUT_DIR [--mixed]

writes ``OUT_DIR/NNNN.npz`` (``input`` [16, 288], ``state`` [2, 16, 128], ``sr`` 8000); with
``--mixed`` the 16 kHz batches are copied in too, alternating (16 kHz, 8 kHz, ...), so that the
first batches (held for the fidelity check) cover both rates.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TAPS = 63
CUTOFF = 0.45  # of the 8 kHz Nyquist band, as a fraction of the 16 kHz Nyquist: 3.6 kHz


def lowpass_taps(taps: int = TAPS, cutoff: float = CUTOFF / 2) -> np.ndarray:
    """A Hamming-windowed sinc low-pass filter; ``cutoff`` in cycles per sample."""
    n = np.arange(taps) - (taps - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(taps)
    return h / h.sum()


def decimate(rows: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """Each row low-pass filtered (edges reflected) and every second sample kept."""
    pad = len(taps) // 2
    padded = np.pad(rows.astype(np.float64), ((0, 0), (pad, pad)), mode="reflect")
    filtered = np.stack([np.convolve(row, taps, mode="valid") for row in padded])
    return filtered[:, ::2].astype(np.float32)


def eight_khz_batches(model: Path, calib: Path) -> list[dict[str, np.ndarray]]:
    """The 8 kHz batches, one per 16 kHz batch of ``calib`` (sorted by name)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    taps = lowpass_taps()
    state = np.zeros((2, 1, 128), np.float32)
    out = []
    for path in sorted(calib.glob("*.npz")):
        with np.load(path) as batch:
            audio = decimate(batch["input"], taps)
        states = []
        for row in audio:
            states.append(state)
            feed = {"input": row[None], "state": state, "sr": np.array(8000, np.int64)}
            _, state = session.run(None, feed)
        out.append(
            {
                "input": audio,
                "state": np.concatenate(states, axis=1),
                "sr": np.array(8000, np.int64),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("calib", type=Path, help="folder of 16 kHz .npz batches")
    parser.add_argument("out", type=Path)
    parser.add_argument("--mixed", action="store_true", help="interleave the 16 kHz batches")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    low = eight_khz_batches(args.model, args.calib)
    high = sorted(args.calib.glob("*.npz"))
    batches: list[dict[str, np.ndarray]] = []
    for k, batch in enumerate(low):
        if args.mixed:
            with np.load(high[k]) as original:
                batches.append(dict(original))
        batches.append(batch)
    for k, batch in enumerate(batches):
        np.savez(args.out / f"{k:04d}.npz", **batch)
    print(f"wrote {len(batches)} batches to {args.out} ({len(low)} at 8 kHz)")


if __name__ == "__main__":
    main()
