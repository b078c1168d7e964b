"""Real third-party models and real, offline data for ``tests/real``.

Models: ``scripts/fetch_test_models.py`` downloads pinned wheels from PyPI (rapidocr-onnxruntime
1.4.4 for PaddleOCR's cls/det/rec, silero-vad 6.2.3) into ``$ONNXQ_TEST_MODELS`` or
``~/.cache/onnxq/test-models`` and extracts the sha256-checked ONNX files.  Without access to the
package index the tests are skipped (set ``ONNXQ_REQUIRE_REAL_MODELS=1`` to fail instead).

Data: the two photos scikit-learn ships (``load_sample_images``: china.jpg, flower.jpg; 427x640
RGB) with lines of real English text drawn on them.  The text is scikit-learn's own dataset
descriptions (``load_breast_cancer().DESCR``, ``load_wine().DESCR``), drawn with Pillow's built-in
scalable font.  Drawing text is needed because the photos alone hold none: on bare crops the
PP-OCRv4 detector's probability map stays below 1e-5 everywhere and the recognizer emits the
CTC blank on ~98% of its time steps, so an agreement metric on them would be vacuous.

Calibration and evaluation never share a photo or a text source: calibration batches are crops
of china.jpg with breast-cancer text, evaluation batches crops of flower.jpg with wine text.
Preprocessing follows RapidOCR/PaddleOCR: BGR, ``(x / 255 - 0.5) / 0.5``, NCHW float32; cls input
``[1, 3, 48, 192]`` (half of the samples turned by 180 degrees, the class the model predicts),
rec ``[1, 3, 48, 320]``, det ``[1, 3, H, W]`` with H and W multiples of 32 in two shapes.
Resizing is bilinear in numpy.  Pillow is needed anyway: scikit-learn reads the JPEGs with it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = ROOT / "scripts" / "fetch_test_models.py"

Batch = dict[str, np.ndarray]

# det shapes (H, W): both multiples of 32, small enough to keep the det tests fast
DET_SHAPES = ((160, 256), (192, 320))


def _fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("onnxq_fetch_test_models", FETCH_SCRIPT)
    assert spec is not None and spec.loader is not None, FETCH_SCRIPT
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


def unavailable(reason: str) -> None:
    """Skip, or fail when ``ONNXQ_REQUIRE_REAL_MODELS=1`` (a CI that must run these tests)."""
    if os.environ.get("ONNXQ_REQUIRE_REAL_MODELS") == "1":
        pytest.fail(f"{reason} (ONNXQ_REQUIRE_REAL_MODELS=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_models() -> dict[str, Path]:
    """``{name: path}`` of the fetched models (skips when the package index is unreachable)."""
    fetch = _fetch_module()
    try:
        return fetch.fetch(quiet=False)
    except fetch.DownloadError as exc:
        unavailable(f"real test models unavailable (no access to the package index?): {exc}")
        raise
    except fetch.FetchError as exc:
        pytest.fail(f"real test models could not be prepared: {exc}")


# -- photos, text and preprocessing ------------------------------------------------------------


@cache
def photo(name: str) -> np.ndarray:
    """One of scikit-learn's sample photos (``china.jpg`` or ``flower.jpg``), RGB uint8."""
    from sklearn.datasets import load_sample_images

    images = load_sample_images()
    for filename, image in zip(images.filenames, images.images, strict=True):
        if Path(filename).name == name:
            return np.asarray(image)
    raise KeyError(name)


@cache
def corpus(name: str) -> tuple[str, ...]:
    """Words of a scikit-learn dataset description (``breast_cancer`` or ``wine``)."""
    from sklearn import datasets

    text = getattr(datasets, f"load_{name}")().DESCR
    words = []
    for raw in text.split():
        word = raw.strip("*:`_|")
        if word.isascii() and word.isprintable() and any(c.isalnum() for c in word):
            words.append(word[:24])
    return tuple(words)


def phrase(words: tuple[str, ...], rng: np.random.Generator, max_chars: int) -> str:
    """Consecutive words from a random place in ``words``, at most ``max_chars`` long."""
    start = int(rng.integers(0, len(words)))
    out = words[start][:max_chars]
    for word in words[start + 1 :]:
        if len(out) + 1 + len(word) > max_chars:
            break
        out += " " + word
    return out


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HxWxC image with half-pixel centres (as cv2.INTER_LINEAR); float32."""
    h0, w0 = image.shape[:2]
    ys = np.clip((np.arange(height) + 0.5) * h0 / height - 0.5, 0, h0 - 1)
    xs = np.clip((np.arange(width) + 0.5) * w0 / width - 0.5, 0, w0 - 1)
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h0 - 1), np.minimum(x0 + 1, w0 - 1)
    wy = (ys - y0)[:, None, None].astype(np.float32)
    wx = (xs - x0)[None, :, None].astype(np.float32)
    f = image.astype(np.float32)
    top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
    bottom = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def random_crop(
    image: np.ndarray,
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.3, 1.0),
) -> np.ndarray:
    """A random crop of roughly the target aspect ratio, resized to ``height x width``."""
    h0, w0 = image.shape[:2]
    aspect = width / height * rng.uniform(0.8, 1.25)
    max_h = min(h0, w0 / aspect)
    ch = max(8, int(max_h * rng.uniform(*scale)))
    cw = min(w0, round(ch * aspect))
    y = int(rng.integers(0, h0 - ch + 1))
    x = int(rng.integers(0, w0 - cw + 1))
    return resize_bilinear(image[y : y + ch, x : x + cw], height, width)


@cache
def _font(size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def draw_text(
    canvas: np.ndarray, text: str, x: int, y: int, size: int, rng: np.random.Generator
) -> np.ndarray:
    """Draw ``text`` on an RGB float image, dark on light background or light on dark."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    font = _font(size)
    left, top, right, bottom = draw.textbbox((x, y), text, font=font)
    region = canvas[max(top, 0) : max(bottom, 1), max(left, 0) : max(right, 1)]
    base = 20 if (region.mean() if region.size else 128.0) > 110 else 235
    color = tuple(int(np.clip(base + rng.integers(-20, 21), 0, 255)) for _ in range(3))
    draw.text((x, y), text, fill=color, font=font)
    return np.asarray(image).astype(np.float32)


def to_input(rgb: np.ndarray) -> np.ndarray:
    """RapidOCR's preprocessing of an RGB HxWx3 image: BGR, (x/255 - 0.5)/0.5, NCHW float32."""
    x = (rgb[..., ::-1] / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def cls_sample(
    image: np.ndarray, words: tuple[str, ...], rng: np.random.Generator, turned: bool
) -> np.ndarray:
    """A 48x192 text line for the direction classifier, turned by 180 degrees if ``turned``."""
    canvas = random_crop(image, 48, 192, rng, scale=(0.15, 0.6))
    size = int(rng.integers(24, 32))
    text = phrase(words, rng, int(rng.integers(6, 12)))
    canvas = draw_text(canvas, text, int(rng.integers(2, 10)), int(24 - size * 0.65), size, rng)
    return to_input(canvas[::-1, ::-1] if turned else canvas)


def rec_sample(
    image: np.ndarray, words: tuple[str, ...], rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    """A 48x320 text line for the recognizer and the text drawn on it."""
    canvas = random_crop(image, 48, 320, rng, scale=(0.15, 0.6))
    size = int(rng.integers(26, 34))
    text = phrase(words, rng, int(rng.integers(8, int(300 / (size * 0.55)))))
    x = int(rng.integers(2, 12))
    while len(text) > 1 and _font(size).getlength(text) > 320 - x - 2:
        text = text[:-1].rstrip()  # the label is exactly what is visible
    canvas = draw_text(canvas, text, x, int(24 - size * 0.65), size, rng)
    return to_input(canvas), text


def det_sample(
    image: np.ndarray,
    words: tuple[str, ...],
    rng: np.random.Generator,
    height: int,
    width: int,
    lines: int,
) -> np.ndarray:
    """A ``height x width`` scene crop with ``lines`` lines of text (0: the bare photo)."""
    canvas = random_crop(image, height, width, rng)
    for _ in range(lines):
        size = int(rng.integers(14, 28))
        text = phrase(words, rng, int(width / (size * 0.55)))
        canvas = draw_text(
            canvas,
            text,
            int(rng.integers(2, width // 5)),
            int(rng.integers(0, height - size - 4)),
            size,
            rng,
        )
    return to_input(canvas)


# -- data sets ----------------------------------------------------------------------------------


@dataclass
class Split:
    """Calibration batches, evaluation batches, and what the evaluation samples hold."""

    calibration: list[Batch]
    evaluation: list[Batch]
    labels: list[Any] = field(default_factory=list)


def _need_pillow() -> None:
    try:
        import PIL
        import sklearn  # noqa: F401
        from PIL import features
    except ImportError as exc:
        unavailable(
            f"{exc.name} is not installed: scikit-learn ships the sample photos, Pillow "
            "reads them and draws the text lines (pip install 'pillow>=10.1' "
            "scikit-learn)"
        )
        raise
    if tuple(int(p) for p in PIL.__version__.split(".")[:2]) < (10, 1):
        unavailable("Pillow >= 10.1 is needed for ImageFont.load_default(size=...)")
    if not features.check("freetype2"):
        unavailable("Pillow was built without FreeType: its scalable default font is missing")


def _split(
    make: Callable[[np.ndarray, tuple[str, ...], np.random.Generator, int, bool], Any],
    n_calibration: int,
    n_evaluation: int,
) -> tuple[list[Any], list[Any]]:
    """``make(photo, words, rng, index, evaluation)`` for each calibration/evaluation sample."""
    _need_pillow()
    calib_rng, eval_rng = np.random.default_rng(0), np.random.default_rng(1)
    calib = [
        make(photo("china.jpg"), corpus("breast_cancer"), calib_rng, i, False)
        for i in range(n_calibration)
    ]
    evals = [
        make(photo("flower.jpg"), corpus("wine"), eval_rng, i, True) for i in range(n_evaluation)
    ]
    return calib, evals


@pytest.fixture(scope="session")
def cls_data() -> Split:
    """Direction classifier: 32 calibration and 64 evaluation lines; labels 0 (0 deg) / 1 (180)."""
    calib, evals = _split(lambda img, w, r, i, _: cls_sample(img, w, r, turned=i % 2 == 1), 32, 64)
    return Split(
        [{"x": x} for x in calib], [{"x": x} for x in evals], [i % 2 for i in range(len(evals))]
    )


@pytest.fixture(scope="session")
def rec_data() -> Split:
    """Recognizer: 16 calibration and 32 evaluation lines; labels are the drawn texts."""
    calib, evals = _split(lambda img, w, r, i, _: rec_sample(img, w, r), 16, 32)
    return Split([{"x": x} for x, _ in calib], [{"x": x} for x, _ in evals], [t for _, t in evals])


def _det_lines(index: int, evaluation: bool) -> int:
    return 0 if evaluation and index % 3 == 2 else 2


@pytest.fixture(scope="session")
def det_data() -> Split:
    """Detector: 16 calibration and 12 evaluation scenes in two shapes (dynamic H and W).

    Every scene holds two text lines, except every third evaluation scene, a bare crop of the
    photo (label 0: no text; the float map stays near 0 there, so it tests for false text).
    """
    calib, evals = _split(
        lambda img, w, r, i, ev: det_sample(img, w, r, *DET_SHAPES[i % 2], _det_lines(i, ev)),
        16,
        12,
    )
    return Split(
        [{"x": x} for x in calib],
        [{"x": x} for x in evals],
        [_det_lines(i, True) for i in range(len(evals))],
    )


def vad_chunks(seed: int, n: int) -> list[Batch]:
    """Silero VAD inputs: 576-sample 16 kHz chunks of sine mixtures with noise, zero state."""
    rng = np.random.default_rng(seed)
    t = np.arange(576) / 16000.0
    chunks = []
    for _ in range(n):
        freqs = rng.uniform(80.0, 3000.0, 3)[:, None]
        amps = rng.uniform(0.0, 0.3, 3)[:, None]
        phases = rng.uniform(0.0, 2 * np.pi, 3)[:, None]
        wave = (amps * np.sin(2 * np.pi * freqs * t + phases)).sum(axis=0)
        wave += rng.normal(0.0, rng.uniform(0.001, 0.05), t.size)
        chunks.append(
            {
                "input": wave[None].astype(np.float32),
                "state": np.zeros((2, 1, 128), np.float32),
                "sr": np.array(16000, dtype=np.int64),
            }
        )
    return chunks


@pytest.fixture(scope="session")
def vad_data() -> Split:
    """Silero VAD: 16 calibration and 16 evaluation chunks (different seeds)."""
    return Split(vad_chunks(0, 16), vad_chunks(1, 16))
