"""Calibration from a folder of images: decode, resize, crop, normalize, batch.

A :class:`Preprocess` says how pixels become the model's input; :class:`ImageFolder` applies it
to every ``.jpg/.jpeg/.png/.bmp/.webp`` file of a folder (sorted by name, not recursive, hidden
files skipped) and yields ``{input_name: batch}``, one batch in memory at a time.  Pillow is
imported lazily.  The spec grammar of :meth:`Preprocess.from_spec` is in ``docs/calibration.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxq.data.inputs import Batch, InputSpec
from onnxq.errors import CalibrationDataError, ConfigError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
ORDERS, LAYOUTS, DTYPES = ("RGB", "BGR"), ("NCHW", "NHWC"), ("float32", "float16", "uint8")
SPEC_KEYS = ("preset", "resize", "crop", "scale", "mean", "std", "order", "layout", "dtype")
_ALIASES = {"center_crop": "crop", "channel_order": "order"}
_FIELDS = {"crop": "center_crop", "order": "channel_order"}
_FLAGS = {
    **{o.lower(): ("order", o) for o in ORDERS},
    **{x.lower(): ("layout", x) for x in LAYOUTS},
    **{d: ("dtype", d) for d in DTYPES},
}


def _fail(field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"preprocess: {field}={value!r} is not valid; allowed: {allowed}")


def _size(field: str, value: Any, square: bool) -> int | tuple[int, int] | None:
    """``None``, a positive int, or a positive ``(h, w)``; an int becomes ``(n, n)`` if square."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return (value, value) if square else value
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return (value[0], value[1])
    raise _fail(field, value, "a positive int or a (height, width) pair of positive ints, or None")


def _triple(field: str, value: Any, nonzero: bool) -> tuple[float, float, float]:
    vals = [value] * 3 if isinstance(value, (int, float)) else value
    try:
        out = tuple(float(v) for v in vals)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or not all(math.isfinite(v) and (v or not nonzero) for v in out):
        raise _fail(field, value, f"3 finite {'non-zero ' if nonzero else ''}numbers (R, G, B)")
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class Preprocess:
    """How an RGB image becomes one model input (the default is raw 0..255 float32 NCHW RGB).

    Steps: resize (an int scales the shorter side, keeping the aspect ratio; ``(h, w)`` is
    exact), center crop ``(h, w)``, ``x * scale``, ``(x - mean) / std`` with mean/std in RGB
    order, then channel order, layout and dtype.  ``uint8`` output takes raw pixels, so it
    needs scale 1, mean 0 and std 1.
    """

    resize: int | tuple[int, int] | None = None
    center_crop: tuple[int, int] | None = None
    scale: float = 1.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    channel_order: str = "RGB"
    layout: str = "NCHW"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "resize", _size("resize", self.resize, square=False))
        put(self, "center_crop", _size("center_crop", self.center_crop, square=True))
        scale = self.scale
        ok = isinstance(scale, (int, float)) and not isinstance(scale, bool)
        if not (ok and math.isfinite(scale) and scale):
            raise _fail("scale", self.scale, "a finite non-zero number, e.g. 1/255")
        put(self, "scale", float(self.scale))
        put(self, "mean", _triple("mean", self.mean, nonzero=False))
        put(self, "std", _triple("std", self.std, nonzero=True))
        for field, allowed in (("channel_order", ORDERS), ("layout", LAYOUTS), ("dtype", DTYPES)):
            value = getattr(self, field)
            norm = str(value).lower() if field == "dtype" else str(value).upper()
            if not isinstance(value, str) or norm not in allowed:
                raise _fail(field, value, ", ".join(allowed))
            put(self, field, norm)
        if self.dtype == "uint8" and (self.scale, self.mean, self.std) != (1.0, (0,) * 3, (1,) * 3):
            raise ConfigError(
                "preprocess: dtype=uint8 feeds raw 0..255 pixels; set scale=1,mean=0,"
                "std=1 (or use dtype=float32 to normalize)"
            )

    @classmethod
    def from_spec(cls, spec: str | Mapping[str, Any]) -> Preprocess:
        """Parse a ``--preprocess`` string (``imagenet,bgr``, ``resize=256,crop=224,...``) or a
        YAML mapping (same keys, values may be lists/numbers); see ``docs/calibration.md``."""
        if isinstance(spec, str):
            items: list[tuple[str, Any]] = []
            for token in (t.strip() for t in spec.split(",")):
                key, eq, value = token.partition("=")
                key = key.strip().lower()
                if eq:
                    items.append((key, value.strip()))
                elif key in PRESETS:
                    items.append(("preset", key))
                elif key in _FLAGS:
                    items.append(_FLAGS[key])
                elif key:
                    raise ConfigError(
                        f"preprocess {spec!r}: {token!r} is not a preset or flag; "
                        f"presets: {', '.join(PRESETS)}; flags: {', '.join(_FLAGS)}"
                    )
        elif isinstance(spec, Mapping):
            items = [(str(k).lower(), v) for k, v in spec.items()]
        else:
            raise ConfigError(
                f"preprocess: expected a string or a mapping, got {type(spec).__name__}"
            )
        if not items:
            raise ConfigError(f"preprocess {spec!r} is empty; give a preset, e.g. imagenet")
        items = [(_ALIASES.get(k, k), v) for k, v in items]
        unknown = [k for k, _ in items if k not in SPEC_KEYS]
        if unknown:
            raise ConfigError(
                f"preprocess {spec!r}: unknown key {unknown[0]!r}; valid keys: "
                f"{', '.join(SPEC_KEYS)} (and bare flags {', '.join(_FLAGS)})"
            )
        presets = [str(v).lower() for k, v in items if k == "preset"]
        if len(presets) > 1 or (presets and presets[0] not in PRESETS):
            raise ConfigError(f"preprocess {spec!r}: give one preset out of {', '.join(PRESETS)}")
        base = PRESETS[presets[0]] if presets else cls()
        fields = {_FIELDS.get(k, k): _parse_value(k, v) for k, v in items if k != "preset"}
        return dataclasses.replace(base, **fields)

    def to_spec(self) -> str:
        """This preprocessing as a ``--preprocess`` string (round-trips through from_spec)."""

        def seq(v: Any) -> str:
            return (
                "none" if v is None else ":".join(map(str, v)) if isinstance(v, tuple) else str(v)
            )

        return (
            f"resize={seq(self.resize)},crop={seq(self.center_crop)},scale={self.scale!r},"
            f"mean={seq(self.mean)},std={seq(self.std)},order={self.channel_order.lower()},"
            f"layout={self.layout.lower()},dtype={self.dtype}"
        )


def _parse_value(key: str, value: Any) -> Any:
    """A spec value (string from the CLI, or a YAML scalar/list) as a Preprocess field value."""
    if not isinstance(value, str):
        return tuple(value) if isinstance(value, list) else value
    text = value.strip().lower()
    try:
        if key in ("resize", "crop"):
            parts = text.replace("x", ":").split(":")
            sizes = None if text == "none" else tuple(int(p) for p in parts)
            return sizes[0] if sizes and len(sizes) == 1 else sizes
        if key in ("scale", "mean", "std"):
            nums = [
                float(a) / float(b) if b else float(a)
                for a, _, b in (p.partition("/") for p in text.split(":"))
            ]
            return nums[0] if len(nums) == 1 else tuple(nums)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(
            f"preprocess: {key}={value!r} is not a number or a ':'-separated list "
            "of numbers (e.g. scale=1/255, mean=0.485:0.456:0.406, crop=224:224)"
        ) from None
    return value


_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PRESETS: dict[str, Preprocess] = {
    "imagenet": Preprocess(256, (224, 224), 1 / 255, *_IMAGENET),
    "0-1": Preprocess(scale=1 / 255),
    "tf": Preprocess(scale=1 / 255, mean=(0.5,) * 3, std=(0.5,) * 3),
    "-1..1": Preprocess(scale=1 / 255, mean=(0.5,) * 3, std=(0.5,) * 3),
}


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS and path.name[0] != "." and path.is_file()


def _static(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None


class ImageFolder:
    """The images of ``folder`` as batches for ``input_spec``; re-iterable and deterministic.

    With neither resize nor crop, images are resized to the model's static H x W; if H or W is
    dynamic they keep their size, center-cropped down to a multiple of 32.  A static batch
    dimension B needs ``batch_size == B``; then leftover images (fewer than B) are skipped.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        input_spec: InputSpec,
        preprocess: Preprocess,
        batch_size: int = 1,
    ):
        try:
            from PIL import Image
        except ImportError:
            raise CalibrationDataError(
                "calibrating from images needs Pillow: pip install pillow"
            ) from None
        self._image, self.spec, self.preprocess = Image, input_spec, preprocess
        self.folder, self.batch_size = Path(folder), batch_size
        self.files = self._images()
        b = self._read_shape()
        self._len = self._batch_count(b)
        p = preprocess
        if self.h and self.w and p.center_crop is None and isinstance(p.resize, int):
            raise CalibrationDataError(
                f"input {input_spec.name!r} wants {self.h}x{self.w} but resize={p.resize} keeps "
                f"each image's aspect ratio; add crop={self.h}:{self.w} to the preprocess spec"
            )
        planned = p.center_crop or (p.resize if isinstance(p.resize, tuple) else None)
        if planned:
            self._check_hw(planned, "the preprocess spec")

    def _images(self) -> list[Path]:
        """The folder's image files, by name (not searched recursively)."""
        if not self.folder.is_dir():
            raise CalibrationDataError(f"image folder not found: {self.folder}")
        files = sorted(self.folder.iterdir(), key=lambda p: p.name)
        files = [p for p in files if _is_image(p)]
        if not files:
            raise CalibrationDataError(
                f"{self.folder}: no images ({', '.join(IMAGE_EXTENSIONS)}, "
                "not searched recursively); add images or fix the path"
            )
        return files

    def _read_shape(self) -> int | None:
        """Check the input takes 3-channel images of this dtype and set the static H and W
        (None: dynamic); returns the static batch dimension, if any."""
        shape, name, preprocess = self.spec.shape, self.spec.name, self.preprocess
        if shape is not None and len(shape) != 4:
            raise CalibrationDataError(
                f"input {name!r} has shape {list(shape)}; an image folder "
                "feeds 4-D inputs (NCHW or NHWC)"
            )
        dims: list[int | None] = [_static(d) for d in shape] if shape else [None] * 4
        nchw = preprocess.layout == "NCHW"
        b, c, self.h, self.w = dims if nchw else (dims[0], dims[3], dims[1], dims[2])
        if c not in (None, 3):
            other = "nhwc" if nchw else "nchw"
            hint = f"set layout={other}" if dims[3 if nchw else 1] == 3 else "feed .npz batches"
            raise CalibrationDataError(
                f"input {name!r} has shape {self._want()}, i.e. {c} "
                f"channels in {preprocess.layout}; images give 3; {hint}"
            )
        if np.dtype(self.spec.dtype).kind != "f" and preprocess.dtype != "uint8":
            raise CalibrationDataError(
                f"input {name!r} is {self.spec.dtype}; set dtype=uint8,"
                "scale=1,mean=0,std=1 in the preprocess spec"
            )
        return b

    def _batch_count(self, b: int | None) -> int:
        """The number of batches (a static batch dimension ``b`` skips the leftover images)."""
        batch_size = self.batch_size
        if batch_size < 1 or (b is not None and batch_size != b):
            raise ConfigError(
                f"batch size {batch_size} is not valid for input {self.spec.name!r} of shape "
                f"{self._want()}; set the batch size to {b or 'a positive int'}"
            )
        count = len(self.files) // b if b else -(-len(self.files) // batch_size)
        if not count:
            raise CalibrationDataError(
                f"{self.folder}: {len(self.files)} images, fewer than the "
                f"model's fixed batch size {b}; add images"
            )
        return count

    def __len__(self) -> int:
        """The number of batches."""
        return self._len

    def window(self, start: int, stop: int) -> ImageFolder:
        """Batches ``start:stop`` as a source of their own: a small value (file names and the
        preprocessing) that any process seeing the same files reads (:mod:`onnxq.scale`)."""
        part = copy.copy(self)
        stop = min(max(start, stop), self._len)
        part.files = self.files[start * self.batch_size : stop * self.batch_size]
        part._len = stop - start
        return part

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_image"}  # a module

    def __setstate__(self, state: dict[str, object]) -> None:
        from PIL import Image

        self.__dict__.update(state)
        self._image = Image

    def __iter__(self) -> Iterator[Batch]:
        for i in range(self._len):
            chunk = self.files[i * self.batch_size : (i + 1) * self.batch_size]
            pixels = [self._load(path) for path in chunk]
            for path, px in zip(chunk, pixels, strict=True):
                if px.shape != pixels[0].shape:
                    raise CalibrationDataError(
                        f"{path}: {px.shape[0]}x{px.shape[1]} after preprocessing, but "
                        f"{chunk[0].name} is {pixels[0].shape[0]}x{pixels[0].shape[1]}; set "
                        "resize=H:W or crop=H:W so images can share a batch (or batch size 1)"
                    )
            yield {self.spec.name: self._convert(np.stack(pixels))}

    def _want(self) -> str:
        shape = self.spec.shape or ()
        return "[" + ", ".join(str(_static(d) or "?") for d in shape) + "]"

    def _check_hw(self, hw: tuple[int, int], where: str) -> None:
        if (self.h or hw[0], self.w or hw[1]) != hw:
            h, w, p = self.h or hw[0], self.w or hw[1], self.preprocess
            got = f"3x{hw[0]}x{hw[1]}" if p.layout == "NCHW" else f"{hw[0]}x{hw[1]}x3"
            raise CalibrationDataError(
                f"{where}: preprocessing gives {got} images but input {self.spec.name!r} wants "
                f"{self._want()}; set crop={h}:{w} (center crop after resize, e.g. resize="
                f"{round(max(h, w) * 8 / 7)},crop={h}:{w}) or resize={h}:{w}, or leave both "
                "unset to resize to the model's size"
            )

    def _load(self, path: Path) -> np.ndarray:
        """One image as H x W x 3 uint8 RGB, resized and cropped."""
        p, image = self.preprocess, self._image
        try:
            with image.open(path) as im:
                rgb = im.convert("RGB")
            w, h = rgb.size
            size = p.resize
            if isinstance(size, int):
                long = max(1, int(size * max(w, h) / min(w, h)))
                size = (size, long) if h <= w else (long, size)
            elif size is None and p.center_crop is None and self.h and self.w:
                size = (self.h, self.w)
            if size is not None:
                rgb = rgb.resize((size[1], size[0]), image.BILINEAR)
            px = np.asarray(rgb, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, image.DecompressionBombError) as exc:
            raise CalibrationDataError(
                f"{path}: cannot read as an image ({exc}); remove or replace the file"
            ) from None
        h, w = px.shape[:2]
        crop = p.center_crop
        if crop is None and p.resize is None and not (self.h and self.w):
            crop = (self.h or h // 32 * 32, self.w or w // 32 * 32)
            if 0 in crop:
                raise CalibrationDataError(
                    f"{path}: {h}x{w} is under 32 pixels, too small to keep "
                    "at a multiple of 32; set resize=H:W"
                )
        if crop is not None:
            if crop[0] > h or crop[1] > w:
                raise CalibrationDataError(
                    f"{path}: {h}x{w} after resize is smaller than the "
                    f"crop {crop[0]}x{crop[1]}; set a larger resize"
                )
            top, left = round((h - crop[0]) / 2.0), round((w - crop[1]) / 2.0)  # as torchvision
            px = px[top : top + crop[0], left : left + crop[1]]
        self._check_hw(px.shape[:2], str(path))
        return px

    def _convert(self, px: np.ndarray) -> np.ndarray:
        """N x H x W x 3 uint8 RGB -> the model input: normalize, channel order, layout, dtype."""
        p = self.preprocess
        x: np.ndarray = px
        if p.dtype != "uint8":
            x = px.astype(np.float32) * np.float32(p.scale)
            x = (x - np.asarray(p.mean, np.float32)) / np.asarray(p.std, np.float32)
        if p.channel_order == "BGR":
            x = x[..., ::-1]
        if p.layout == "NCHW":
            x = x.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(x, dtype=p.dtype)
