"""Reading params files: the only place YAML becomes config records.

`load_params(path)` returns the raw mapping of the active preset (``params.yaml`` by default, a
copy of one of ``params/<preset>.yaml``); `section(params, "train", TrainConfig)` builds one
record from a dotted key, naming the file and key in every error. A params file is plain data:
YAML anchors and aliases (``&name``, ``*name``) are refused, so a value is written where it is
used, and an alias loop cannot reach the code (or DVC) as a self-containing mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from setdiff.config import ConfigError, build

T = TypeVar("T")

DEFAULT_PARAMS = Path("params.yaml")


class _PlainLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses anchors and aliases (each error at its line and column)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML anchors and aliases (&name, *name) are not allowed in a params file; "
                "write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


class Params(Mapping[str, Any]):
    """A parsed params file that remembers where it came from (for error messages)."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self._data = dict(data)
        self.path = Path(path)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def get_path(self, dotted: str) -> Any:
        """The value at a dotted key such as ``"data.arith"``; a clear error if absent."""
        node: Any = self._data
        for i, part in enumerate(dotted.split(".")):
            if not isinstance(node, Mapping) or part not in node:
                done = ".".join(dotted.split(".")[:i]) or "<top>"
                raise ConfigError(f"{self.path}: missing key {part!r} under {done}")
            node = node[part]
        return node

    def section(self, dotted: str, cls: type[T]) -> T:
        """Build `cls` from the section at `dotted`, naming file and key on any error."""
        return build(cls, self.get_path(dotted), f"{self.path}: {dotted}")


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Parse a params YAML file into a `Params` mapping (must be a mapping at the top)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params file {path} does not exist (run `setdiff preset <name>` first)")
    try:
        with path.open() as f:
            data = yaml.load(f, Loader=_PlainLoader)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error(path, err)) from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return Params(data, path)


def yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """One line ``file:line:column: problem`` (1-based) for a YAML syntax error."""
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return f"{path}: invalid YAML ({' '.join(str(err).split())})"
    message = f"{path}:{mark.line + 1}:{mark.column + 1}: {err.problem}"  # type: ignore[attr-defined]
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark is not None:
        message += f" ({context} at line {context_mark.line + 1})"
    return message
