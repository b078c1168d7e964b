"""When onnxruntime's int8 kernels beat float, per CPU class: the cost rules' thresholds as data.

The cost rules (``onnxq.place.rules.cost``) read five profile fields.  Their values depend on the
CPU: an int8 dot product (VNNI, Arm's SDOT) makes an int8 conv pay sooner than AVX2's
multiply-add pairs do.  A :class:`CostTable` holds them with where they were measured.  onnxq
ships one per CPU class (:data:`SHIPPED`); ``onnxq tune-cpu`` measures one on the machine it
runs on and writes it as JSON, which ``cost_table`` / ``--cost-table`` then selects.  Timing
never happens during ``quantize``: the same inputs and table give the same output.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxq.errors import ConfigError

# what a table file holds besides the thresholds
_FORMAT = "onnxq.cost_table"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class CostTable:
    """The cost thresholds of the onnxruntime profile for one CPU class.

    Attributes:
        cpu: the CPU class (``onnxq.backends.cpu.CPU_CLASSES``) it was measured on, or is for.
        measured_on: the CPU model and onnxruntime version of the measurement, or why there
            was none.
        float_grouped_convs: a grouped (depthwise) conv takes int8 only inside a chain.
        min_macs_per_output: products summed per output element below which int8 loses.
        channel_alignment: input channels per group the int8 conv kernel takes in one step.
        min_macs_per_output_unaligned: the same for a spatial conv over unaligned channels.
        min_macs: multiply-adds per sample below which the Q/DQ around an op cost more.
    """

    cpu: str
    measured_on: str
    float_grouped_convs: bool
    min_macs_per_output: int
    channel_alignment: int
    min_macs_per_output_unaligned: int
    min_macs: int

    def thresholds(self) -> dict[str, Any]:
        """The profile fields this table sets."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("cpu", "measured_on")
        }

    def to_json(self) -> str:
        """The table file's text."""
        body = {"format": _FORMAT, "version": _FORMAT_VERSION, **dataclasses.asdict(self)}
        return json.dumps(body, indent=2) + "\n"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CostTable:
        """Read a table written by ``onnxq tune-cpu``; a :class:`ConfigError` says what is
        wrong with it."""
        where = f"cost_table {path}"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ConfigError(f"{where}: not an onnxq cost table (write one with onnxq tune-cpu)")
        if data.get("version") != _FORMAT_VERSION:
            raise ConfigError(
                f"{where}: version {data.get('version')!r}; this onnxq reads {_FORMAT_VERSION}"
            )
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        return cls.from_dict(body, where)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "cost table") -> CostTable:
        """Build from a dict, checking names and types."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if set(data) != set(fields):
            missing, extra = sorted(set(fields) - set(data)), sorted(set(data) - set(fields))
            raise ConfigError(f"{where}: missing {missing}, unknown {extra}")
        for name, kind in fields.items():
            value = data[name]
            ok = {
                "str": isinstance(value, str),
                "bool": isinstance(value, bool),
                "int": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            }[str(kind)]
            if not ok:
                raise ConfigError(f"{where}: {name}: expected {kind}, got {value!r}")
        from onnxq.backends.cpu import cpu_class

        cpu_class(data["cpu"], f"{where}: cpu")
        return cls(**data)


def _xeon(cpu: str) -> CostTable:
    return CostTable(
        cpu=cpu,
        measured_on=(
            "Intel Xeon with AVX-512 VNNI and AMX-INT8, onnxruntime 1.31.1; kept on an AMD "
            "EPYC Zen 4 (onnxruntime 1.32.0), where its own tuned table ran whole zoo models "
            "no faster"
        ),
        float_grouped_convs=True,
        min_macs_per_output=32,
        channel_alignment=4,
        min_macs_per_output_unaligned=96,
        min_macs=65536,
    )


def _unmeasured(cpu: str, like: CostTable) -> CostTable:
    return dataclasses.replace(
        like,
        cpu=cpu,
        measured_on=(
            f"not measured on this class ({cpu}): the x86-vnni thresholds; `onnxq tune-cpu` "
            "on such a machine measures its own (--cost-table)"
        ),
    )


_VNNI = _xeon("x86-vnni")
SHIPPED: dict[str, CostTable] = {
    "x86-vnni": _VNNI,
    "x86-avx2": _unmeasured("x86-avx2", _VNNI),
    "arm64": _unmeasured("arm64", _VNNI),
    "arm64-dot": _unmeasured("arm64-dot", _VNNI),
    "other": _unmeasured("other", _VNNI),
}
