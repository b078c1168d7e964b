"""How a field of a config section is declared and checked: :func:`option` gives
its default, value check and other accepted types; :func:`coerce` brings a value from Python or
YAML to the field's type, naming the field when it cannot; :func:`check_values` runs the value
checks."""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from onnxq.backends.cpu import cpu_class
from onnxq.errors import ConfigError

# a field's value check: (field name, value) -> raises ConfigError when the value is wrong
Validate = Callable[[str, Any], None]


def must(test: Callable[[Any], bool], text: str) -> Validate:
    """A check that ``test`` holds (``None`` passes): ``"<field>: must <text>, got <value>"``."""

    def validate(name: str, value: Any) -> None:
        if value is not None and not test(value):
            raise ConfigError(f"{name}: must {text}, got {value!r}")

    return validate


def one_of(values: Callable[[], Sequence[str]], what: str) -> Validate:
    """A check that the value is one of ``values()``: ``"<field>: unknown <what> ..."``."""

    def validate(name: str, value: Any) -> None:
        if value not in values():
            raise ConfigError(f"{name}: unknown {what} {value!r}; valid: {', '.join(values())}")

    return validate


def option(
    default: Any,
    validate: Validate | None = None,
    *,
    also: tuple[type, ...] = (),
    parse: Callable[[Any, str], Any] | None = None,
) -> Any:
    """A field of a config section: its default, its value check, other Python types it
    takes (``also``) besides its annotation's, and ``parse(value, where)``, which turns an
    accepted value into the annotated type (errors naming ``where``)."""
    return field(default=default, metadata={"validate": validate, "also": also, "parse": parse})


def share_of(value: float | str | None, name: str) -> float | None:
    """A share from a number or a percentage string (``0.1``, ``"0.1"``, ``"10%"``); ``name``:
    the field, for the error."""
    if not isinstance(value, str):
        return None if value is None else float(value)
    text = value.strip()
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a share such as 0.1 or 10%, got {value!r}") from None


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, dataclasses.Field[Any]]]:
    """Field name -> (its resolved type annotation, the field) of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(cls)}


def check_values(cls: type, values: dict[str, Any], prefix: str) -> None:
    """Run the value check of each given field of ``cls``; errors name the field after
    ``prefix``."""
    for key, value in values.items():
        validate = _fields(cls)[key][1].metadata["validate"]
        if validate is not None:
            validate(f"{prefix}{key}", value)


def _accepted(hint: Any) -> tuple[type, ...]:
    """The Python types a value of annotation ``hint`` may have (before parsing)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _accepted(arg))
    if hint is float:
        return (int, float)
    if typing.get_origin(hint) is tuple:
        return (list, tuple)
    return (hint,)


def coerce(cls: type, key: str, value: Any, where: str) -> Any:
    """``value`` checked against the type of ``cls``'s field ``key`` and brought to it (a list
    becomes a tuple; the field's ``parse`` turns a mapping of overrides into
    :class:`~onnxq.config.overrides.Override` values, a preprocess mapping into its spec)."""
    hint, spec = _fields(cls)[key]
    expected = _accepted(hint) + spec.metadata["also"]
    if isinstance(value, bool) and bool not in expected:
        raise ConfigError(f"{where}: {key}: expected {_names(expected)}, got a boolean")
    if not isinstance(value, expected):
        raise ConfigError(
            f"{where}: {key}: expected {_names(expected)}, got {type(value).__name__} {value!r}"
        )
    if spec.metadata["parse"] is not None:
        return spec.metadata["parse"](value, where)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if not all(isinstance(v, item) for v in value):
            raise ConfigError(f"{where}: {key}: expected a list of {_names((item,))}s")
        return tuple(value)
    return value


def _names(types_: tuple[type, ...]) -> str:
    names = {
        int: "integer",
        float: "number",
        str: "string",
        bool: "boolean",
        list: "list",
        tuple: "list",
        dict: "mapping",
        type(None): "null",
    }
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types_))


def plain_fields(config: Any) -> dict[str, Any]:
    """The fields of dataclass ``config`` as a plain dict (YAML/JSON-ready): tuples as lists,
    overrides as dicts without their ``None`` fields."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "overrides":
            value = [
                {k: v for k, v in dataclasses.asdict(o).items() if v is not None} for o in value
            ]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The parsed YAML of a config file (safe loader: no code runs); an unreadable file or
    invalid YAML is a :class:`ConfigError` naming the file."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}".replace("\n", " ")) from None


def check_cpu_class(value: str | None, name: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is None or a CPU class name."""
    if value is not None:
        cpu_class(value, name)


def check_target(value: str | None, name: str) -> None:
    """Raise :class:`ConfigError` unless ``value`` is None or an accuracy target."""
    if value is not None:
        from onnxq.numerics.accuracy_target import parse_target

        parse_target(value, name)


def preprocess_spec(value: Any, where: str = "config") -> Any:
    """A preprocess mapping (YAML, Python) as its spec string; other values as given."""
    if isinstance(value, dict):  # a mapping (YAML, Python) becomes its spec string
        from onnxq.data.images import Preprocess

        return Preprocess.from_spec(value).to_spec()
    return value


class Section:
    """A config section (a frozen dataclass of :func:`option` fields): checked when it is
    built, values from Python like those from YAML, type then value."""

    def __post_init__(self) -> None:
        settle(self)


def settle(config: Any) -> None:
    """Bring each field of frozen dataclass ``config`` to its type (:func:`coerce`), then run
    the value checks: values from Python are checked like those from YAML."""
    cls = type(config)
    for f in dataclasses.fields(config):
        object.__setattr__(config, f.name, coerce(cls, f.name, getattr(config, f.name), "config"))
    check_values(cls, vars(config), "")
