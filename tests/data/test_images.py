"""Image-folder calibration: presets, the spec grammar, shapes and error messages."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (pip install pillow)")

from onnxq.data.images import PRESETS, ImageFolder, Preprocess  # noqa: E402
from onnxq.data.sources import InputSpec, check_batch  # noqa: E402
from onnxq.errors import CalibrationDataError, ConfigError  # noqa: E402

F32 = np.dtype("float32")
SMALL = InputSpec("x", F32, (1, 3, 32, 32))
DYN_BATCH = InputSpec("x", F32, ("N", 3, 32, 32))
IMAGENET = InputSpec("x", F32, (1, 3, 224, 224))


def write(folder: Path, name: str, size=(40, 56), mode="RGB", seed=0) -> Path:
    """A seeded random image of ``size`` (h, w) in ``mode``, saved under ``folder``."""
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    px = rng.integers(0, 256, size=(*size, channels), dtype=np.uint8)
    image = Image.fromarray(px[..., 0] if channels == 1 else px, mode)
    folder.mkdir(parents=True, exist_ok=True)
    image.save(folder / name)
    return folder / name


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three images: an RGB PNG, a grayscale JPEG and an RGBA PNG (sorted a, b, c)."""
    write(tmp_path / "img", "a.png", (40, 56), "RGB", 1)
    write(tmp_path / "img", "b.jpg", (60, 36), "L", 2)
    write(tmp_path / "img", "c.png", (33, 33), "RGBA", 3)
    return tmp_path / "img"


def reference(path: Path, resize, crop, scale, mean, std) -> np.ndarray:
    """The preprocessing redone step by step in float64, HWC RGB."""
    im = Image.open(path).convert("RGB")
    if isinstance(resize, int):
        w, h = im.size
        long = int(resize * max(w, h) / min(w, h))
        resize = (resize, long) if h <= w else (long, resize)
    if resize:
        im = im.resize((resize[1], resize[0]), Image.BILINEAR)
    px = np.asarray(im).astype(np.float64)
    if crop:
        top, left = round((px.shape[0] - crop[0]) / 2), round((px.shape[1] - crop[1]) / 2)
        px = px[top : top + crop[0], left : left + crop[1]]
    return (px * scale - np.array(mean)) / np.array(std)


def only(source: ImageFolder) -> list[np.ndarray]:
    return [batch["x"] for batch in source]


# ---------------------------------------------------------------------------- presets
def test_imagenet_preset_matches_torchvision_arithmetic(folder):
    source = ImageFolder(folder, IMAGENET, PRESETS["imagenet"])
    batches = only(source)
    assert len(source) == len(batches) == 3
    for path, got in zip(source.files, batches, strict=True):
        assert got.shape == (1, 3, 224, 224) and got.dtype == np.float32
        want = reference(
            path, 256, (224, 224), 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        )
        np.testing.assert_allclose(got[0], want.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)
        check_batch({"x": got}, [IMAGENET], 0)


@pytest.mark.parametrize(
    ("preset", "lo", "hi", "mean_std"),
    [
        ("0-1", 0.0, 1.0, (0.0, 1.0)),
        ("tf", -1.0, 1.0, (0.5, 0.5)),
        ("-1..1", -1.0, 1.0, (0.5, 0.5)),
    ],
)
def test_presets_resize_to_the_models_static_size(folder, preset, lo, hi, mean_std):
    source = ImageFolder(folder, SMALL, Preprocess.from_spec(preset))
    for path, got in zip(source.files, only(source), strict=True):
        assert got.shape == (1, 3, 32, 32) and got.dtype == np.float32
        assert lo <= got.min() and got.max() <= hi
        want = reference(path, (32, 32), None, 1 / 255, (mean_std[0],) * 3, (mean_std[1],) * 3)
        np.testing.assert_allclose(got[0], want.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)


def test_tf_preset_is_x_over_127_5_minus_1(folder):
    (got,) = only(ImageFolder(folder, DYN_BATCH, PRESETS["tf"], batch_size=3))
    raw = only(ImageFolder(folder, DYN_BATCH, Preprocess(), batch_size=3))[0]
    np.testing.assert_allclose(got, raw / 127.5 - 1, atol=1e-6)
    assert raw.min() >= 0 and raw.max() <= 255 and raw.max() > 1


def test_grayscale_and_rgba_become_rgb(folder):
    source = ImageFolder(folder, SMALL, Preprocess())
    _, gray, rgba = only(source)
    assert np.array_equal(gray[0, 0], gray[0, 1]) and np.array_equal(gray[0, 0], gray[0, 2])
    rgb = np.asarray(Image.open(folder / "c.png"))[..., :3]
    resized = np.asarray(Image.fromarray(rgb).resize((32, 32), Image.BILINEAR))
    np.testing.assert_array_equal(rgba[0].transpose(1, 2, 0), resized)


def test_palette_image_is_read(tmp_path):
    write(tmp_path, "p.png", (20, 20), "RGB")
    Image.open(tmp_path / "p.png").convert("P").save(tmp_path / "p.png")
    (got,) = only(ImageFolder(tmp_path, SMALL, PRESETS["0-1"]))
    assert got.shape == (1, 3, 32, 32)


# ---------------------------------------------------------------- order, layout, dtype
def test_bgr_swaps_channels_after_normalizing_with_rgb_mean(folder):
    rgb = only(ImageFolder(folder, IMAGENET, Preprocess.from_spec("imagenet")))
    bgr = only(ImageFolder(folder, IMAGENET, Preprocess.from_spec("imagenet,bgr")))
    for a, b in zip(rgb, bgr, strict=True):
        np.testing.assert_array_equal(b, a[:, ::-1])


def test_nhwc_layout_is_the_transpose(folder):
    nhwc_spec = InputSpec("x", F32, (1, 32, 32, 3))
    nchw = only(ImageFolder(folder, SMALL, PRESETS["0-1"]))
    nhwc = only(ImageFolder(folder, nhwc_spec, Preprocess.from_spec("0-1,nhwc")))
    for a, b in zip(nchw, nhwc, strict=True):
        assert b.shape == (1, 32, 32, 3) and b.flags.c_contiguous
        np.testing.assert_array_equal(b, a.transpose(0, 2, 3, 1))


def test_float16_and_uint8_outputs(folder):
    half = only(ImageFolder(folder, SMALL, Preprocess.from_spec("0-1,float16")))
    full = only(ImageFolder(folder, SMALL, PRESETS["0-1"]))
    assert half[0].dtype == np.float16
    np.testing.assert_allclose(half[0], full[0], atol=1e-3)
    u8 = InputSpec("x", np.dtype("uint8"), (1, 3, 32, 32))
    raw = only(ImageFolder(folder, u8, Preprocess(dtype="uint8")))
    assert raw[0].dtype == np.uint8
    np.testing.assert_allclose(raw[0] / 255, full[0], atol=1e-6)


def test_uint8_model_needs_uint8_preprocess(folder):
    u8 = InputSpec("x", np.dtype("uint8"), (1, 3, 32, 32))
    with pytest.raises(CalibrationDataError, match="set dtype=uint8"):
        ImageFolder(folder, u8, PRESETS["0-1"])


# ------------------------------------------------------------------- batches, files
def test_batch_size_2_with_3_images_gives_2_and_1(folder):
    source = ImageFolder(folder, DYN_BATCH, PRESETS["0-1"], batch_size=2)
    batches = only(source)
    assert len(source) == 2 and [b.shape[0] for b in batches] == [2, 1]
    single = only(ImageFolder(folder, DYN_BATCH, PRESETS["0-1"]))
    np.testing.assert_array_equal(batches[0], np.concatenate(single[:2]))
    np.testing.assert_array_equal(batches[1], single[2])


def test_static_batch_1_rejects_batch_size_2(folder):
    with pytest.raises(ConfigError, match="set the batch size to 1"):
        ImageFolder(folder, SMALL, PRESETS["0-1"], batch_size=2)


def test_static_batch_2_drops_the_leftover_image(folder):
    spec = InputSpec("x", F32, (2, 3, 32, 32))
    source = ImageFolder(folder, spec, PRESETS["0-1"], batch_size=2)
    assert len(source) == 1 and only(source)[0].shape == (2, 3, 32, 32)


def test_files_are_sorted_case_insensitive_and_not_recursive(tmp_path):
    for name in ("b.JPEG", "a.PNG", "c.bmp", "d.webp", "e.Jpg", ".hidden.png"):
        write(tmp_path, name)
    (tmp_path / "notes.txt").write_text("not an image")
    write(tmp_path / "sub", "z.png")
    source = ImageFolder(tmp_path, SMALL, PRESETS["0-1"])
    assert [p.name for p in source.files] == ["a.PNG", "b.JPEG", "c.bmp", "d.webp", "e.Jpg"]
    assert len(only(source)) == 5


def test_iteration_is_deterministic(folder):
    source = ImageFolder(folder, IMAGENET, PRESETS["imagenet"])
    for a, b in zip(only(source), only(source), strict=True):
        np.testing.assert_array_equal(a, b)


def test_dynamic_size_is_cut_to_a_multiple_of_32(tmp_path):
    write(tmp_path, "a.png", (70, 100))
    spec = InputSpec("x", F32, ("N", 3, "H", "W"))
    (got,) = only(ImageFolder(tmp_path, spec, PRESETS["0-1"]))
    assert got.shape == (1, 3, 64, 96)
    want = reference(tmp_path / "a.png", None, (64, 96), 1 / 255, (0,) * 3, (1,) * 3)
    np.testing.assert_allclose(got[0], want.transpose(2, 0, 1), atol=1e-6)
    (unknown,) = only(ImageFolder(tmp_path, InputSpec("x", F32, None), PRESETS["0-1"]))
    assert unknown.shape == (1, 3, 64, 96)


def test_dynamic_sizes_that_differ_cannot_share_a_batch(tmp_path):
    write(tmp_path, "a.png", (64, 64))
    write(tmp_path, "b.png", (64, 96))
    spec = InputSpec("x", F32, ("N", 3, "H", "W"))
    with pytest.raises(CalibrationDataError, match=r"b\.png: 64x96 .* resize=H:W or crop=H:W"):
        list(ImageFolder(tmp_path, spec, PRESETS["0-1"], batch_size=2))
    assert len(only(ImageFolder(tmp_path, spec, Preprocess.from_spec("0-1,resize=64:64"), 2))) == 1


# ---------------------------------------------------------------------------- errors
def test_shape_mismatch_names_the_preprocess_fields_to_set(folder):
    with pytest.raises(CalibrationDataError) as info:
        ImageFolder(folder, IMAGENET, Preprocess.from_spec("0-1,resize=256:256"))
    message = str(info.value)
    assert "3x256x256" in message and "[1, 3, 224, 224]" in message
    assert "crop=224:224" in message and "resize=224:224" in message


def test_shorter_side_resize_without_crop_asks_for_a_crop(folder):
    with pytest.raises(CalibrationDataError, match=r"resize=256 keeps .* add crop=224:224"):
        ImageFolder(folder, IMAGENET, Preprocess.from_spec("imagenet,crop=none"))


def test_channels_mismatch_suggests_the_other_layout(folder):
    nhwc_model = InputSpec("x", F32, (1, 224, 224, 3))
    with pytest.raises(CalibrationDataError, match="set layout=nhwc"):
        ImageFolder(folder, nhwc_model, PRESETS["imagenet"])
    with pytest.raises(CalibrationDataError, match="1 channels"):
        ImageFolder(folder, InputSpec("x", F32, (1, 1, 28, 28)), PRESETS["0-1"])
    with pytest.raises(CalibrationDataError, match="4-D"):
        ImageFolder(folder, InputSpec("x", F32, (1, 784)), PRESETS["0-1"])


def test_empty_or_missing_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(CalibrationDataError, match=r"no images \(\.jpg"):
        ImageFolder(tmp_path, SMALL, PRESETS["0-1"])
    with pytest.raises(CalibrationDataError, match="not found"):
        ImageFolder(tmp_path / "nope", SMALL, PRESETS["0-1"])


def test_corrupt_image_names_the_file(folder):
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    source = ImageFolder(folder, SMALL, PRESETS["0-1"])
    with pytest.raises(CalibrationDataError, match=r"broken\.jpg: cannot read as an image"):
        list(source)


def test_crop_larger_than_the_image(tmp_path):
    write(tmp_path, "a.png", (20, 20))
    spec = InputSpec("x", F32, ("N", 3, "H", "W"))
    with pytest.raises(CalibrationDataError, match=r"a\.png: 20x20 .* smaller than the crop"):
        list(ImageFolder(tmp_path, spec, Preprocess.from_spec("0-1,crop=32")))


def test_missing_pillow_says_how_to_install(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(CalibrationDataError, match="pip install pillow"):
        ImageFolder(folder, SMALL, PRESETS["0-1"])


# ------------------------------------------------------------------------ spec grammar
def test_spec_full_form_equals_the_imagenet_preset():
    text = (
        "resize=256,crop=224,scale=1/255,mean=0.485:0.456:0.406,std=0.229:0.224:0.225,"
        "order=rgb,layout=nchw,dtype=float32"
    )
    assert Preprocess.from_spec(text) == PRESETS["imagenet"]
    assert Preprocess.from_spec("imagenet") == PRESETS["imagenet"]
    assert Preprocess.from_spec(" IMAGENET , ") == PRESETS["imagenet"]


def test_spec_flags_and_overrides_apply_after_the_preset():
    p = Preprocess.from_spec("bgr,imagenet,nhwc,crop=192x160,resize=none")
    assert p.channel_order == "BGR" and p.layout == "NHWC"
    assert p.center_crop == (192, 160) and p.resize is None and p.scale == 1 / 255
    assert Preprocess.from_spec("tf") == Preprocess.from_spec("-1..1")
    assert Preprocess.from_spec("scale=1,mean=127.5,std=127.5").mean == (127.5,) * 3
    aliased = Preprocess.from_spec("resize=300:400,center_crop=8,channel_order=bgr")
    assert aliased.resize == (300, 400) and aliased.center_crop == (8, 8)


def test_spec_from_a_yaml_mapping():
    p = Preprocess.from_spec(
        {"preset": "imagenet", "crop": [192, 192], "mean": 0.5, "scale": "1/255", "order": "BGR"}
    )
    assert p.center_crop == (192, 192) and p.mean == (0.5,) * 3 and p.channel_order == "BGR"
    assert Preprocess.from_spec({"resize": 256, "std": [1, 2, 3]}).std == (1.0, 2.0, 3.0)


def test_to_spec_round_trips():
    for p in [*PRESETS.values(), Preprocess.from_spec("imagenet,bgr,nhwc,float16,resize=9:7")]:
        assert Preprocess.from_spec(p.to_spec()) == p


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("imagenet,size=224", r"unknown key 'size'; valid keys: preset, resize, crop, scale"),
        ({"normalize": True}, "unknown key 'normalize'; valid keys"),
        ("imagnet", "'imagnet' is not a preset or flag; presets: imagenet, 0-1, tf"),
        ("imagenet,tf", "give one preset"),
        ("preset=vgg", "give one preset out of imagenet"),
        ("scale=1/0", "scale='1/0' is not a number"),
        ("mean=a:b:c", "mean='a:b:c' is not a number"),
        ("mean=0.5:0.5", r"mean=\(0\.5, 0\.5\) is not valid; allowed: 3 finite numbers"),
        ("std=0", "std=0.0 is not valid; allowed: 3 finite non-zero numbers"),
        ("crop=0", "center_crop=0 is not valid"),
        ("resize=1:2:3", r"resize=\(1, 2, 3\) is not valid"),
        ("layout=nwhc", "layout='nwhc' is not valid; allowed: NCHW, NHWC"),
        ("order=rbg", "channel_order='rbg' is not valid; allowed: RGB, BGR"),
        ("dtype=int8", "dtype='int8' is not valid; allowed: float32, float16, uint8"),
        ("imagenet,uint8", "dtype=uint8 feeds raw 0..255 pixels; set scale=1,mean=0,std=1"),
        ("", "is empty"),
        (42, "expected a string or a mapping"),
    ],
)
def test_spec_errors_name_the_field_and_the_allowed_values(spec, match):
    with pytest.raises(ConfigError, match=match):
        Preprocess.from_spec(spec)


def test_dataclass_validates_direct_construction():
    with pytest.raises(ConfigError, match="scale=0 is not valid"):
        Preprocess(scale=0)
    with pytest.raises(ConfigError, match="resize=True is not valid"):
        Preprocess(resize=True)
    assert Preprocess(center_crop=224, channel_order="bgr").center_crop == (224, 224)
