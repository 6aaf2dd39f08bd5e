"""What a valid metrics file holds: one declarative table (`SCHEMAS`) of required fields and
bounds per kind of file, and `problems(kind, data)`, the one check of a parsed file against it.

Both readers of the metrics use it: `reports` (a bad file is listed under "Missing inputs" and
its numbers are not used) and ``setdiff summary`` (it refuses a bad file with one line). Neither
may import the other (``reports`` never imports ``setdiff``, which imports torch; ``setdiff``
never imports ``reports``), so the table lives here, below both, and imports only the standard
library. Every number anywhere in a file must also be finite: a NaN the writer let through
(Python's json reads a bare ``NaN``) makes the file unusable.

A field's path is dotted; ``*`` stands for every value of a mapping or every item of a list
(``rows.*.accuracy``), and a list of numbers is checked item by item (``ci95``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

__all__ = ["SCHEMAS", "Field", "describe", "problems"]


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a metrics file: where it is, whether it must be there, its bounds."""

    path: str
    """Dotted path inside the JSON object; ``*`` matches every value / item."""
    low: float | None = None
    """Smallest valid value (inclusive), None for no lower bound."""
    high: float | None = None
    """Largest valid value (inclusive), None for no upper bound."""
    required: bool | str = False
    """True: must be present; a field name: must be present when that field is (same object)."""
    nullable: bool = False
    """Whether ``null`` is a valid value (the writer's "could not be computed")."""
    text: bool = False
    """A string (task, paradigm) instead of a number."""


def _fraction(path: str, **kw: Any) -> Field:
    return Field(path, 0.0, 1.0, **kw)


def _count(path: str, **kw: Any) -> Field:
    return Field(path, 0.0, None, **kw)


def _ratio(path: str, **kw: Any) -> Field:
    """A speedup, a CI end or a rate: > 0 in practice, never negative."""
    return Field(path, 0.0, None, **kw)


_NAMES = (Field("task", required=True, text=True), Field("paradigm", required=True, text=True))
_TEXTGEN_FRACTIONS = ("infill_rouge_l", "infill_exact", "uncond_stopped_share")
_TEXTGEN_FRACTIONS += ("uncond_distinct_1", "uncond_distinct_2", "uncond_distinct_3")
_TEXTGEN_FRACTIONS += ("uncond_repetition_rate_4",)
_COMPARISONS = ("setdlm_vs_ar", "setdlm_vs_bd3lm", "aogpt_vs_mdlm", "ar_engines.*")

SCHEMAS: dict[str, tuple[Field, ...]] = {
    "evaluate": (
        *_NAMES,
        Field("nll_per_token", 0.0, required=True),
        Field("ppl", 1.0, required=True),
        _count("n_tokens", required=True),
        _count("n_sequences", required=True),
        _fraction("accuracy", required="n_answers"),
        _fraction("score", required="n_answers"),
        _count("n_answers", required="accuracy"),
        _ratio("tokens_per_forward"),
        _ratio("tokens_per_second"),
    ),
    "train": (
        _count("steps", required=True),
        Field("final_eval_loss", 0.0, required=True),
        # null when a resumed run had no step left to train (`setdiff.train`)
        Field("final_train_loss", 0.0, required=True, nullable=True),
        _count("seconds", required=True),
        _count("parameters", required=True),
        _count("resumed_from"),
    ),
    "curve": (
        *_NAMES,
        _count("n_examples", required=True),
        _count("points.*.step", required=True),
        _fraction("points.*.accuracy", required=True),
    ),
    "textgen": (
        *_NAMES,
        *(_fraction(name, nullable=True) for name in _TEXTGEN_FRACTIONS),
        Field("uncond_gen_ppl", 1.0, nullable=True),
        _count("n_infill"),
        _count("n_uncond"),
        _ratio("infill_tokens_per_second", nullable=True),
        _ratio("uncond_tokens_per_second", nullable=True),
    ),
    "tradeoff": (
        *(_ratio(f"{c}.speedup") for c in _COMPARISONS[:3]),
        *(_ratio(f"{c}.ci95", nullable=True, required="speedup") for c in _COMPARISONS[:3]),
        _ratio("ar_engines.*.engine_over_own_ar"),
        _ratio("ar_engines.*.ci95", nullable=True, required="engine_over_own_ar"),
        _ratio("ar_engines.*.setdlm_vs_vllm"),
        _fraction("points.*.accuracy", required=True),
        _ratio("points.*.tokens_per_second", nullable=True),
        _count("points.*.n"),
    ),
    "setsize": (
        _count("n_examples"),
        _fraction("rows.*.accuracy", required=True),
        Field("rows.*.set_size", 1.0, required=True),
        Field("rows.*.window", 1.0, nullable=True),
        Field("main.*.set_size", 1.0),
    ),
    "seeds": (
        _fraction("paradigms.*.accuracies", required=True),
        _fraction("paradigms.*.mean", required=True),
        _count("paradigms.*.sd", nullable=True),
        _count("paradigms.*.binomial_se", nullable=True),
    ),
    "backbone": (
        _count("n_examples"),
        _fraction("rows.*.ar"),
        _count("rows.*.parameters"),
    ),
    "lossless": (
        _fraction("figures.*.accuracy", required=True),
        _ratio("figures.*.tokens_per_second", required=True),
        _ratio("figures.*.tokens_per_forward"),
        _fraction("figures.*.draft_acceptance", nullable=True),
        _count("figures.*.identical_to_reference", nullable=True),
        _count("figures.*.n"),
        _ratio("figures.*.speedup_vs_ar.estimate"),
        _ratio("figures.*.speedup_vs_best.estimate"),
    ),
    "lmeval": (
        _fraction("engines.*.lmeval_accuracy"),
        _fraction("engines.*.setdiff_accuracy"),
        _count("engines.*.n"),
        _count("engines.*.same_text"),
        _count("engines.*.same_verdict"),
    ),
}
"""Kind of metrics file (the reports' input kinds) -> its fields. A field not listed is free,
except that every number must be finite."""


def describe(value: Any) -> str:
    """A value as a problem names it (``NaN``, ``inf``, ``1.7``, ``'x'``)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return repr(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _matches(node: Any, parts: list[str], label: str) -> Iterator[tuple[str, Any, Any]]:
    """(label, parent object, last key) of every place `parts` can name under `node`."""
    head, rest = parts[0], parts[1:]
    if not rest:
        if isinstance(node, dict):
            yield f"{label}{head}", node, head
        return
    if head == "*":
        items = node.items() if isinstance(node, dict) else enumerate(node)
        if isinstance(node, dict | list):
            for key, child in items:
                yield from _matches(child, rest, f"{label}{key}.")
    elif isinstance(node, dict) and head in node:
        yield from _matches(node[head], rest, f"{label}{head}.")


def _check(field: Field, label: str, value: Any) -> str | None:
    if value is None:
        return None if field.nullable else f"field '{label}' is null"
    if field.text:
        return None if isinstance(value, str) else f"field '{label}' is not text"
    if isinstance(value, list) and all(_is_number(v) or v is None for v in value):
        found = (_check(field, f"{label}[{i}]", v) for i, v in enumerate(value))
        return next((p for p in found if p), None)
    if not _is_number(value):
        return f"field '{label}' = {describe(value)} is not a number"
    if not math.isfinite(value):
        return f"field '{label}' is {describe(value)}"
    low = -math.inf if field.low is None else field.low
    high = math.inf if field.high is None else field.high
    if not low <= value <= high:
        bounds = f"[{_num(field.low, '-inf')}, {_num(field.high, 'inf')}]"
        return f"field '{label}' = {describe(value)} outside {bounds}"
    return None


def _num(bound: float | None, default: str) -> str:
    return default if bound is None else f"{bound:g}"


def _non_finite(node: Any, label: str) -> Iterator[str]:
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _non_finite(child, f"{label}.{key}" if label else str(key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _non_finite(child, f"{label}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        yield f"field '{label}' is {describe(node)}"


def problems(kind: str, data: Any) -> list[str]:
    """What makes the parsed file `data` of `kind` (a `SCHEMAS` key) unusable; [] when valid.

    Each problem is one phrase naming the field: ``field 'accuracy' missing``, ``field
    'accuracy' is NaN``, ``field 'accuracy' = 1.7 outside [0, 1]``."""
    if not isinstance(data, dict):
        return ["unreadable: not a JSON object"]
    found: list[str] = []
    for field in SCHEMAS.get(kind, ()):
        for label, parent, key in _matches(data, field.path.split("."), ""):
            needed = field.required is True or (field.required and field.required in parent)
            if key not in parent:
                found += [f"field '{label}' missing"] if needed else []
            else:
                found += [p for p in [_check(field, label, parent[key])] if p]
    return found + [p for p in _non_finite(data, "") if p not in found]
