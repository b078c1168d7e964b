"""The calibration cache: observed statistics saved as JSON (``--save-calibration``) and read
back (``--load-calibration``) to quantize again without data, checked against the model."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from onnxq import ir
from onnxq.errors import CalibrationDataError
from onnxq.numerics.tensor_stats import TensorStats

CACHE_FORMAT = "onnxq-calibration"
CACHE_VERSION = 1


def calibration_cache(
    stats: dict[str, TensorStats],
    graph: ir.Graph,
    backend: str | None = None,
    body_runs: dict[str, int] | None = None,
    unobservable: dict[str, str] | None = None,
) -> bytes:
    """Observed statistics as the JSON text of a calibration cache, with each tensor's inferred
    shape (``graph`` before Q/DQ are placed) and the ``backend`` whose placement chose the
    tensors (each backend observes different ones); for a model with control flow, how often
    each body ran (``bodies``) and the tensors that have no statistics, with why
    (``unobserved``)."""
    import json

    doc: dict[str, object] = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        **({"backend": backend} if backend else {}),
        "tensors": {
            name: {"shape": shape, "stats": stats[name].to_json()}
            for name, shape in _shapes_json(graph, sorted(stats)).items()
        },
        **({"bodies": dict(sorted(body_runs.items()))} if body_runs else {}),
        **({"unobserved": dict(sorted(unobservable.items()))} if unobservable else {}),
    }
    return (json.dumps(doc, indent=1) + "\n").encode("utf-8")


def cached_control_flow(path: str | os.PathLike[str]) -> tuple[dict[str, int], dict[str, str]]:
    """How often each control-flow body ran, and the tensors without statistics (-> why), as
    a cache of :func:`calibration_cache` recorded them (empty for a model without bodies)."""
    doc = _read_cache(Path(path))
    bodies, unobserved = doc.get("bodies", {}), doc.get("unobserved", {})
    if not isinstance(bodies, dict) or not isinstance(unobserved, dict):
        raise CalibrationDataError(f"{path}: malformed 'bodies' or 'unobserved' entries")
    return {str(k): int(v) for k, v in bodies.items()}, {
        str(k): str(v) for k, v in unobserved.items()
    }


def load_calibration(
    path: str | os.PathLike[str],
    graph: ir.Graph,
    wanted: dict[str, bool],
    backend: str | None = None,
) -> dict[str, TensorStats]:
    """Statistics for ``wanted`` tensors from a cache of :func:`calibration_cache` (those it
    records as unobserved are left out: :func:`cached_control_flow` says why)."""
    p = Path(path)
    doc = _read_cache(p)
    tensors = doc.get("tensors", {})
    unobserved = doc.get("unobserved", {})
    wanted = {t: hist for t, hist in wanted.items() if t not in unobserved}
    missing = sorted(t for t in wanted if t not in tensors)
    if missing:
        made = doc.get("backend")
        if backend and made and made != backend:
            raise CalibrationDataError(
                f"{p}: the cache was saved with --backend {made}, and --backend {backend} "
                f"quantizes other tensors ({len(missing)} without statistics, e.g. "
                f"{', '.join(missing[:3])}); load it with --backend {made}, or calibrate "
                f"again with data and --save-calibration under --backend {backend}"
            )
        raise CalibrationDataError(
            f"{p}: no statistics for {len(missing)} tensor(s) this model quantizes, e.g. "
            f"{', '.join(missing[:5])}; the cache belongs to another model or other settings: "
            "calibrate again with data"
        )
    shapes = _shapes_json(graph, wanted)
    changed = [t for t in wanted if tensors[t].get("shape") != shapes[t]]
    if changed:
        t = changed[0]
        raise CalibrationDataError(
            f"{p}: tensor {t!r} had shape {tensors[t].get('shape')} when calibrated, the model "
            f"now gives {shapes[t]} ({len(changed)} tensor(s) changed); calibrate "
            "again with data"
        )
    out = {}
    for name, needs_hist in wanted.items():
        try:
            stats = TensorStats.from_json(name, tensors[name]["stats"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationDataError(
                f"{p}: statistics of {name!r} are malformed ({exc})"
            ) from None
        if needs_hist and not stats.histogram:
            raise CalibrationDataError(
                f"{p}: tensor {name!r} was calibrated without a histogram (method minmax); "
                "calibrate again with the histogram method you want"
            )
        out[name] = stats
    return out


def cached_tensors(path: str | os.PathLike[str]) -> set[str]:
    """The tensors a calibration cache has statistics for."""
    return set(_read_cache(Path(path)).get("tensors", {}))


def _read_cache(p: Path) -> dict[str, Any]:
    """The JSON document of a calibration cache, checked for its format and version."""
    import json

    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationDataError(f"cannot read calibration cache {p}: {exc.strerror}") from None
    except ValueError as exc:
        raise CalibrationDataError(f"{p}: not a JSON calibration cache: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise CalibrationDataError(f"{p}: not an onnxq calibration cache (format field)")
    if doc.get("version") != CACHE_VERSION:
        raise CalibrationDataError(
            f"{p}: calibration cache version {doc.get('version')!r}, this onnxq reads "
            f"{CACHE_VERSION}; calibrate again with --save-calibration"
        )
    return doc


def _shapes_json(graph: ir.Graph, names: Iterable[str]) -> dict[str, list[int | None] | None]:
    """Each tensor's inferred shape as the cache records it (a body's tensor: from its body)."""
    defined_in = ir.scope_index(ir.scopes(graph))
    out: dict[str, list[int | None] | None] = {}
    for name in names:
        shape = defined_in.get(name, graph).shape(name)
        out[name] = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    return out
