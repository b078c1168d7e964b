"""Regenerate the screenshots in docs/img/: the quantize report and the analyze page of the
bundled digits example, rendered by headless Chromium (Debian: ``apt-get install chromium``).

Usage::

    python scripts/docs_screenshots.py [--chromium chromium] [--out docs/img]

The pages are made with this checkout's onnxq (``python -m onnxq.cli``) in a temporary folder;
the PNGs are reduced to a 64-colour palette to stay small.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits"
SHOTS = {  # page -> (png name, window size)
    "report.html": ("report.png", "1200,1250"),
    "analyze.html": ("analyze.png", "1200,1500"),
}


def onnxq(*args: str, cwd: Path) -> None:
    """Run this checkout's CLI; stop with its stderr on failure."""
    done = subprocess.run(
        [sys.executable, "-m", "onnxq.cli", *args], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"onnxq {args[0]} failed:\n{done.stderr}")


def make_pages(work: Path) -> None:
    """The digits example quantized for onnxruntime (its report), and quantized for tensorrt
    with ranges that clip 1% of the values and analyzed (the analyze page: a problem to find)."""
    model, calib = str(EXAMPLE / "digits_cnn.onnx"), str(EXAMPLE / "calib")
    onnxq("quantize", model, "-o", "ort.onnx", "--calib", calib, "--backend", "onnxruntime",
          "--report", "report.html", "-q", cwd=work)  # fmt: skip
    onnxq("quantize", model, "-o", "trt.onnx", "--calib", calib, "--method", "percentile",
          "--percentile", "99", "-q", cwd=work)  # fmt: skip
    onnxq("analyze", model, "trt.onnx", "--calib", calib, "--report", "analyze.html", cwd=work)


def screenshot(chromium: str, page: Path, png: Path, size: str) -> None:
    """Render ``page`` to ``png`` and shrink it to a palette image."""
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", f"--window-size={size}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with Image.open(png) as img:
        img.convert("RGB").quantize(colors=64).save(png, optimize=True)


def main() -> int:
    """Make the pages, take the screenshots, print where they went."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_pages(work)
        for page, (name, size) in SHOTS.items():
            screenshot(args.chromium, work / page, args.out / name, size)
            print(f"wrote {args.out / name} ({(args.out / name).stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
