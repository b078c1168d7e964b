"""QuantConfig: every option of a quantization run, as one frozen, validated value made of
sections.

Each field is declared once, in the section of the stage that reads it
(:mod:`onnxq.config.sections` lists them: ``profile``, ``placement``, ``calibration``,
``weights``, ``recovery``, ``accuracy``, ``weightonly``, ``validate``, ``run``), with its
default, its type (what YAML and ``from_dict`` accept, and what a wrong value's error names)
and its value check (:func:`~onnxq.config.fields.option`).  QuantConfig holds one value of each
section (``cfg.recovery.adaround``) and reads a field by its own name too (``cfg.adaround``),
as it is given: ``QuantConfig(adaround=True)``, a flat or nested YAML file
(:meth:`QuantConfig.from_yaml`), ``--set recovery.adaround=true``.

A QuantConfig says what the user asked for; :meth:`QuantConfig.recipe` turns it into the run's
recipe (:mod:`onnxq.config.recipes`: static, dynamic or weight-only), which holds the sections
its kind of run reads and refuses, at construction, an option that kind would ignore.

To add a field: declare it in its section with its check, document it in that section's
docstring and in ``docs/config.md`` (a test holds them together), and read it from the
section in the stage that uses it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxq.backends.profile import BACKENDS, BackendProfile
from onnxq.backends.target import profile_for
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.fields import plain_fields, read_yaml
from onnxq.config.options import (
    WEIGHT_METHODS,
    WEIGHT_STORAGE,
    AccuracyOptions,
    ProfileOptions,
    RunOptions,
    ValidateOptions,
    WeightOptions,
)
from onnxq.config.overrides import Override, TensorSettings
from onnxq.config.placement import PlacementOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.config.sections import SECTION_OF, SECTION_TYPES, SECTIONS
from onnxq.config.weightonly import WEIGHT_ALGORITHMS, WEIGHT_ONLY, WeightOnlyOptions
from onnxq.errors import ConfigError

if TYPE_CHECKING:
    from onnxq.config.recipes import Recipe


@dataclass(frozen=True, init=False)
class QuantConfig:
    """All options of one quantization run: one value of each section.

    ``QuantConfig(backend="onnxruntime", adaround=True)`` takes fields by their own names;
    ``QuantConfig(recovery=RecoveryOptions(adaround=True))`` takes whole sections (the named
    fields then apply on top of them).  ``cfg.adaround`` reads a field; ``cfg.recovery`` its
    section.  The fields and their meaning are documented in their sections
    (:mod:`onnxq.config.sections`) and in ``docs/config.md``.
    """

    profile: ProfileOptions
    placement: PlacementOptions
    calibration: CalibrationOptions
    weights: WeightOptions
    recovery: RecoveryOptions
    accuracy: AccuracyOptions
    weightonly: WeightOnlyOptions
    validate: ValidateOptions
    run: RunOptions

    def __init__(
        self,
        *,
        profile: ProfileOptions | None = None,
        placement: PlacementOptions | None = None,
        calibration: CalibrationOptions | None = None,
        weights: WeightOptions | None = None,
        recovery: RecoveryOptions | None = None,
        accuracy: AccuracyOptions | None = None,
        weightonly: WeightOnlyOptions | None = None,
        validate: ValidateOptions | None = None,
        run: RunOptions | None = None,
        **fields: Any,
    ) -> None:
        given = {
            "profile": profile,
            "placement": placement,
            "calibration": calibration,
            "weights": weights,
            "recovery": recovery,
            "accuracy": accuracy,
            "weightonly": weightonly,
            "validate": validate,
            "run": run,
        }
        unknown = sorted(set(fields) - set(SECTION_OF))
        if unknown:
            raise ConfigError(
                f"config: unknown option {unknown[0]!r}; valid options: "
                + ", ".join(sorted(SECTION_OF))
            )
        for name, (_, cls) in SECTION_TYPES.items():
            section = given[name]
            if section is not None and not isinstance(section, cls):
                raise ConfigError(
                    f"config: {name}: expected a {cls.__name__}, got {type(section).__name__}"
                )
            mine = {k: v for k, v in fields.items() if SECTION_OF[k] == name}
            if section is None:
                section = cls(**mine)
            elif mine:
                section = dataclasses.replace(section, **mine)
            object.__setattr__(self, name, section)

    def __getattr__(self, name: str) -> Any:
        # a field by its own name (``cfg.adaround``); called only when no attribute has it
        section = SECTION_OF.get(name)
        if section is None or name.startswith("__"):
            raise AttributeError(f"QuantConfig has no option {name!r}")
        return getattr(self.__dict__[section], name)

    @classmethod
    def field_names(cls) -> list[str]:
        """Every field's name, section by section (the order of :meth:`to_dict`)."""
        return [name for _, names in SECTIONS.values() for name in names]

    def recipe(self) -> Recipe:
        """The run's recipe (static, dynamic or weight-only: :mod:`onnxq.config.recipes`), or a
        :class:`ConfigError` naming the first option that kind of run would ignore."""
        from onnxq.config.recipes import recipe_for

        return recipe_for(self)

    def backend_profile(self) -> tuple[BackendProfile, str]:
        """The run's backend profile and its weight-range note
        (:func:`onnxq.backends.target.profile_for` of the profile section and the precisions
        placement names), or a :class:`ConfigError` when the backend cannot run them."""
        return profile_for(self.profile, self.placement.precisions(), self.placement.high_precision)

    def node_excluded(self, node_name: str, op_type: str) -> str | None:
        """The pattern that keeps this node float, or ``None``."""
        return self.placement.node_excluded(node_name, op_type)

    def tensor_excluded(self, tensor_name: str) -> str | None:
        """The override that keeps this tensor float, or ``None``."""
        return self.placement.tensor_excluded(tensor_name)

    def settings_for(self, tensor_name: str, consumers: list[tuple[str, str]]) -> TensorSettings:
        """Method, bits, scheme and precision of a tensor
        (:meth:`PlacementOptions.settings_for`)."""
        return self.placement.settings_for(tensor_name, consumers)

    def unmatched(self, nodes: list[tuple[str, str]], tensors: set[str]) -> list[str]:
        """The exclude patterns and overrides that match nothing (a typo)."""
        return self.placement.unmatched(nodes, tensors)

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with some fields (by their names) or sections changed, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A plain flat dict (YAML/JSON-ready), section by section; overrides as dicts without
        ``None`` fields."""
        return {k: v for name in SECTIONS for k, v in plain_fields(getattr(self, name)).items()}

    def to_sections(self) -> dict[str, dict[str, Any]]:
        """:meth:`to_dict` nested by section (what :meth:`to_yaml` writes)."""
        return {name: plain_fields(getattr(self, name)) for name in SECTIONS}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> QuantConfig:
        """Build from a dict, naming unknown keys and wrong types. Fields may be given flat
        (``adaround: true``) or under their section (``recovery: {adaround: true}``)."""
        from onnxq.config.sections import checked_fields

        return cls(**checked_fields(data, where))

    @classmethod
    def from_sparsebit(cls, doc: dict[str, Any], where: str = "config") -> QuantConfig:
        """Map a Sparsebit qconfig (the parsed YAML mapping; :mod:`onnxq.config.sparsebit`)."""
        from onnxq.config.sparsebit import sparsebit_options

        return cls(**sparsebit_options(doc, where))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> QuantConfig:
        """Load a YAML config file (safe loader: no code runs); a Sparsebit qconfig (top-level
        ``BACKEND`` / ``W`` / ``A``) is read as :meth:`from_sparsebit` reads it."""
        from onnxq.config.sparsebit import is_sparsebit

        data = read_yaml(path)
        if is_sparsebit(data):
            return cls.from_sparsebit(data, where=str(path))
        return cls.from_dict(data or {}, where=str(path))

    def to_yaml(self) -> str:
        """YAML text, nested by section, that :meth:`from_yaml` reads back to an equal
        config."""
        import yaml

        return yaml.safe_dump(self.to_sections(), sort_keys=False)


__all__ = [
    "BACKENDS",
    "WEIGHT_ALGORITHMS",
    "WEIGHT_METHODS",
    "WEIGHT_ONLY",
    "WEIGHT_STORAGE",
    "AccuracyOptions",
    "CalibrationOptions",
    "Override",
    "PlacementOptions",
    "ProfileOptions",
    "QuantConfig",
    "RecoveryOptions",
    "RunOptions",
    "ValidateOptions",
    "WeightOnlyOptions",
    "WeightOptions",
]
