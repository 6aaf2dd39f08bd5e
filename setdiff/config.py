"""Typed, frozen configuration records and the one function that builds them from params.

Every number that can change a result lives in a frozen, keyword-only dataclass. Params files
(YAML mappings) are turned into these records by `build`, which rejects unknown keys and wrong
types with an error that names the key and the file it came from. A field's own bounds are
declared in its type (``threads: Threads = 0``, ``lr: Annotated[float, Bounds(gt=0)]``) and
checked by `build`, naming the key; rules across fields live in each record's `__post_init__`;
derived values are methods. A record whose section also holds keys it cannot name in advance (one
per stage, say) gathers them in one `rest` field. Nothing here reads files.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")

frozen = dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
"""The decorator every config record uses."""


class ConfigError(ValueError):
    """A params value is missing, unknown or invalid. The message names the key and the file."""


def rest() -> Any:
    """A ``Mapping[str, X]`` field that takes every key of the section naming no other field,
    each typed as X and named in errors as it sits in the section (``study.floor``, not
    ``study.<field>.floor``); `to_dict` writes them back beside the other fields. At most one
    per record; its record then refuses no key (whoever knows the valid ones checks them)."""
    return dataclasses.field(default_factory=_empty, metadata={"rest": True})


def _empty() -> Mapping[str, Any]:
    return types.MappingProxyType({})


def _is_rest(field: dataclasses.Field[Any]) -> bool:
    return bool(field.metadata.get("rest"))


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """Bounds of a numeric field, declared in its type: ``Annotated[int, Bounds(ge=1)]``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def check(self, value: float, where: str) -> None:
        for bound, sign, holds in (
            (self.ge, ">=", operator.ge),
            (self.gt, ">", operator.gt),
            (self.le, "<=", operator.le),
            (self.lt, "<", operator.lt),
        ):
            if bound is not None and not holds(value, bound):
                raise ConfigError(f"{where}: must be {sign} {bound:g}, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Matches:
    """A string field's form, declared in its type: ``Annotated[str, Matches(regex, what)]``."""

    pattern: str
    what: str
    """What a matching value is, for the error."""

    def check(self, value: str, where: str) -> None:
        if re.fullmatch(self.pattern, value) is None:
            raise ConfigError(f"{where}: {value!r} is not {self.what}")


Count = Annotated[int, Bounds(ge=1)]
"""A number of things that must be there: steps, examples, a batch size (at least 1)."""
Count0 = Annotated[int, Bounds(ge=0)]
"""A number of things that may be none (warm-up runs, an optional curve)."""
Seed = Annotated[int, Bounds(ge=0)]
"""A random seed (numpy's generators take non-negative seeds only)."""
Threads = Annotated[int, Bounds(ge=0)]
"""torch intra-op threads; 0 = torch's default."""
Positive = Annotated[float, Bounds(gt=0)]
"""A rate, a timeout or a scale: above 0."""
Device = Annotated[
    str, Matches(r"cpu|mps|cuda(:[0-9]+)?", "a torch device: cpu, cuda, cuda:<index> or mps")
]
"""Where a stage computes. Its form is checked with the record; whether this machine has it is
checked when a stage (or ``setdiff preset``) reads it (`setdiff.preset.load_preset`)."""


def build(cls: type[T], mapping: Any, where: str = "params") -> T:
    """Build the dataclass `cls` from a mapping, recursively, with strict key and type checks.

    Args:
        cls: a frozen config dataclass.
        mapping: the parsed YAML section.
        where: dotted location used in error messages, e.g. ``"params/default.yaml: train"``.

    Raises:
        ConfigError: on unknown keys, missing required keys, wrong types, or invalid values
            (the record's own `ValueError` is re-raised naming `where`).
    """
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {mapping!r}")
    every = dataclasses.fields(cls)  # type: ignore[arg-type]
    fields = {f.name: f for f in every if not _is_rest(f)}
    rest_name = next((f.name for f in every if _is_rest(f)), None)
    unknown = sorted(set(mapping) - set(fields))
    if unknown and rest_name is None:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}"
        )
    hints = typing.get_type_hints(cls, include_extras=True)
    rest_item = get_args(hints[rest_name])[1] if rest_name is not None else None
    kwargs: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for name, value in mapping.items():
        if name in fields:
            kwargs[name] = _coerce(hints[name], value, f"{where}.{name}")
        else:  # an entry of the `rest` field
            others[name] = _coerce(rest_item, value, f"{where}.{name}")
    if rest_name is not None:
        kwargs[rest_name] = types.MappingProxyType(others)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing} for {cls.__name__}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {err}") from None


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = get_origin(hint)
    if origin is Annotated:  # a declared rule (`Bounds`, `Matches`) on the typed value
        base, *rules = get_args(hint)
        value = _coerce(base, value, where)
        for rule in rules:
            rule.check(value, where)
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors: dict[Any, ConfigError] = {}
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, where)
            except ConfigError as err:
                errors[option] = err
        # A mapping given for an optional record (`ArithConfig | None`) failed inside that
        # record: its own error names the field and why.
        records = [e for o, e in errors.items() if dataclasses.is_dataclass(o)]
        if len(errors) == 1 or (len(records) == 1 and isinstance(value, Mapping)):
            raise (records or list(errors.values()))[0]
        raise ConfigError(f"{where}: {value!r} matches none of {hint}")
    if origin is Literal:
        if value not in get_args(hint):
            raise ConfigError(f"{where}: {value!r} is not one of {list(get_args(hint))}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = get_args(hint)
        item = args[0] if args else Any
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        _, item = get_args(hint)
        return types.MappingProxyType(
            {k: _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
        )
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {hint}")


def to_dict(config: Any) -> Any:
    """The inverse of `build`: a plain, YAML/JSON-serialisable structure."""
    if dataclasses.is_dataclass(config):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(config):
            value = to_dict(getattr(config, field.name))
            out.update(value if _is_rest(field) else {field.name: value})
        return out
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    if isinstance(config, tuple | list):
        return [to_dict(v) for v in config]
    return config


def check(condition: bool, message: str) -> None:
    """Raise `ValueError(message)` unless `condition`; used in `__post_init__` validation."""
    if not condition:
        raise ValueError(message)
