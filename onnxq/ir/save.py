"""Writing models: deterministic bytes, atomic renames, external data past 2 GB."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

from onnxq.errors import OutputError
from onnxq.ir import external
from onnxq.ir.constants import PROTO_LIMIT
from onnxq.ir.opset import lower_ir_version
from onnxq.ir.weightless import copy_without_initializers, nbytes


# ------------------------------------------------------------------------------- saving
def model_nbytes(model: onnx.ModelProto) -> int:
    """Approximate serialized size: the weights dominate (lazy ones included)."""
    return sum(nbytes(t) for t in model.graph.initializer) + 1_000_000


def weight_nbytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers (lazy ones included): its weights' size on disk."""
    return sum(nbytes(t) for t in model.graph.initializer)


def inline_nbytes(model: onnx.ModelProto) -> int:
    """Approximate size of what the proto itself holds (weights left on disk excluded)."""
    return (
        sum(nbytes(t) for t in model.graph.initializer if t.data_location != TensorProto.EXTERNAL)
        + 1_000_000
    )


def serialize(model: onnx.ModelProto, load_lazy: bool = True) -> bytes:
    """Deterministic serialization for models under the protobuf limit.

    Lazy weights are read in (the bytes are what the model would be had it been loaded
    whole), or with ``load_lazy=False`` kept as references to their files: a header for
    onnxq's own use (:func:`session_bytes_or_path` accepts it back), not a file to share.
    """
    if not load_lazy or not external.has_lazy(model):
        return model.SerializeToString(deterministic=True)
    full = copy_without_initializers(model)
    for tensor in model.graph.initializer:
        full.graph.initializer.append(
            external.loaded_copy(tensor) if external.is_lazy(tensor) else tensor
        )
    return full.SerializeToString(deterministic=True)


def save_model(
    model: onnx.ModelProto, path: str | os.PathLike[str], external_data: bool | None = None
) -> list[Path]:
    """Write ``model`` atomically; returns the files written.

    ``external_data=None`` stores weights in a ``<name>.data`` file beside the model only when
    the model would pass protobuf's 2 GB limit or some weights were left on disk when it was
    loaded (those are copied range by range, never read in whole).  Files appear under their
    final names only when complete (written to a temporary file in the same folder, then
    renamed).
    """
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"output folder does not exist: {folder}")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"output folder is not writable: {folder}")
    if external_data is None:
        external_data = model_nbytes(model) >= PROTO_LIMIT or external.has_lazy(model)
    if not external_data:
        atomic_write_bytes(out, serialize(model))
        return [out]
    return _save_external(model, out)


def _save_external(model: onnx.ModelProto, out: Path, link_lazy: bool = False) -> list[Path]:
    """Weights >= 1 KiB go to ``<out>.data`` (4 KiB aligned); the header references them.

    The header is built beside the model, never by editing it, so no second copy of the
    weights is held: each tensor's bytes live only while they are written.  Lazy weights are
    copied from their file in chunks or, with ``link_lazy`` (onnxruntime's private copy in a
    temporary folder), referenced in a hard link of their file when the filesystem allows.
    """
    data_name = out.name + ".data"
    data_path = out.parent / data_name
    header = copy_without_initializers(model)
    links: dict[str, str | None] = {}
    try:
        with _temp_beside(data_path) as tmp_data:
            offset = 0
            with open(tmp_data, "wb") as fh:
                for tensor in model.graph.initializer:
                    lazy = external.is_lazy(tensor)
                    if lazy and nbytes(tensor) < 1024:
                        header.graph.initializer.append(external.loaded_copy(tensor))
                        continue
                    if not lazy and (
                        nbytes(tensor) < 1024 or tensor.data_location == TensorProto.EXTERNAL
                    ):
                        header.graph.initializer.append(tensor)
                        continue
                    if lazy and link_lazy:
                        ext = external.extent(tensor)
                        linked = _linked(ext.path, out, links)
                        if linked is not None:
                            _add_ref(header, tensor, linked, ext.offset, ext.length)
                            continue
                    pad = (-offset) % 4096
                    fh.write(b"\0" * pad)
                    offset += pad
                    if lazy:
                        length = external.copy_bytes(tensor, fh)
                    else:
                        raw = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
                        fh.write(raw)
                        length = len(raw)
                        del raw
                    _add_ref(header, tensor, data_name, offset, length)
                    offset += length
                fh.flush()
                os.fsync(fh.fileno())
            body = serialize(header)
            del header
            with _temp_beside(out) as tmp_model:
                tmp_model.write_bytes(body)
                _swap_in(tmp_model, out, tmp_data, data_path)
    except OSError as exc:
        raise OutputError(
            f"cannot write {out} and its external data: {exc.strerror or exc}"
        ) from None
    return [out, data_path]


def _swap_in(tmp_model: Path, out: Path, tmp_data: Path, data_path: Path) -> None:
    """Rename the header, then the data; if the data rename fails, put the previous header
    back, so an earlier output never reads weights that are not its own."""
    previous = out.read_bytes() if out.is_file() and out.stat().st_size < 2**26 else None
    os.replace(tmp_model, out)
    try:
        os.replace(tmp_data, data_path)
    except BaseException:
        if previous is not None:
            atomic_write_bytes(out, previous)
        else:
            out.unlink(missing_ok=True)
        raise


def _linked(source: str, out: Path, links: dict[str, str | None]) -> str | None:
    """The name of a hard link of ``source`` beside ``out`` (made once), None if refused."""
    if source not in links:
        name = f"{out.name}.src{len(links)}"
        links[source] = name if external.link_into(source, out.parent / name) else None
    return links[source]


def _add_ref(
    header: onnx.ModelProto, tensor: TensorProto, location: str, offset: int, length: int
) -> None:
    ref = header.graph.initializer.add()
    ref.name, ref.data_type = tensor.name, tensor.data_type
    ref.dims.extend(tensor.dims)
    _mark_external(ref, location, offset, length)


def _mark_external(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="offset", value=str(offset))
    tensor.external_data.add(key="length", value=str(length))


def _file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: 0o666 less the umask (mkstemp's
    0o600 would make models and reports unreadable to the other users of a deployment)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


@contextlib.contextmanager
def _temp_beside(target: Path) -> Iterator[Path]:
    """A temporary path in ``target``'s folder (with a new file's usual mode), removed unless
    renamed away."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
    finally:
        os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename."""
    target = Path(path)
    try:
        with _temp_beside(target) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
    except PermissionError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror}") from None
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None


@functools.lru_cache(maxsize=1)
def runtime_ir_version() -> int:
    """The newest ONNX IR version the installed onnxruntime reads: onnx's own when it reads
    that, else the one its refusal of a probe model names."""
    import onnxruntime as ort  # onnxq's only runtime; imported late to keep ir light

    probe = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 13)],
    )
    probe.ir_version = onnx.IR_VERSION
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        found = re.search(r"max supported IR version: (\d+)", str(exc))
        if found:
            return int(found.group(1))
    return onnx.IR_VERSION


def session_bytes_or_path(model: onnx.ModelProto, workdir: Path) -> bytes | str:
    """What onnxruntime's InferenceSession should load: the serialized model, or a file in
    ``workdir`` for large models.

    A file (from :data:`external.LAZY_BYTES` of weights, or when weights were left on disk)
    saves the serialized copy: onnxruntime maps the external data itself.  Weights left on
    disk stay in their file, hard-linked into ``workdir`` (onnxruntime reads external data only
    from the model's own folder), or copied when the filesystem refuses the link.  A model
    stamped with an IR version newer than onnxruntime reads goes with the version it reads
    when it uses nothing newer (:func:`lower_ir_version`); ``model`` itself keeps its own.
    """
    own = model.ir_version
    lowered = lower_ir_version(model, runtime_ir_version())
    try:
        if not external.has_lazy(model) and model_nbytes(model) < external.LAZY_BYTES:
            return serialize(model)
        path = workdir / "model.onnx"
        _save_external(model, path, link_lazy=True)
        return str(path)
    finally:
        if lowered:
            model.ir_version = own
