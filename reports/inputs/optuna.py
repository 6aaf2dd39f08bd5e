"""Optuna study export (``ablations/<task>/<study>/study.json``) -> one row per trial (pure).

The export is written by ``flows/ablation.py: export_study``: ``objectives`` (name, direction),
``pareto`` (trial numbers) and ``trials`` (number, state, params, values, pareto, and the user
attributes paradigm, decode_options, metrics, ...). Rows follow the ``trials.csv`` layout the
report also accepts: number, state, metric columns (accuracy, tokens_per_second, nfe_mean,
tokens_per_forward), knobs as ``param_<name>``, is_pareto, paradigm, study and objectives.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

METRIC_DIRECTIONS: dict[str, bool] = {
    "accuracy": True,
    "tokens_per_second": True,
    "tokens_per_forward": True,
    "nfe_mean": False,
}
"""Trial metric -> whether larger is better (as `setdiff.ablation.knobs.METRICS` declares)."""


def _knob(value: Any) -> Any:
    """A knob value for a table cell: None (the preset's derived default) reads ``default``."""
    return "default" if value is None else value


def _trial_row(trial: dict[str, Any], objectives: str, study: str) -> dict[str, Any]:
    metrics = dict(trial.get("values") or {}) | dict(trial.get("metrics") or {})
    params = trial.get("params") or {}
    return {
        "number": trial.get("number"),
        "state": trial.get("state"),
        **{m: metrics.get(m) for m in METRIC_DIRECTIONS},
        **{f"param_{k}": _knob(v) for k, v in params.items()},
        "is_pareto": bool(trial.get("pareto")),
        "paradigm": trial.get("paradigm") or params.get("paradigm") or "setdlm",
        "study": study,
        "objectives": objectives,
    }


def flatten_study(data: dict[str, Any]) -> pd.DataFrame:
    """A ``study.json`` export as one row per trial (empty frame when it holds no trials)."""
    objectives = ",".join(str(o.get("name")) for o in data.get("objectives") or [])
    study = str(data.get("study", ""))
    rows = [
        _trial_row(t, objectives, study) for t in data.get("trials") or [] if isinstance(t, dict)
    ]
    return pd.DataFrame(rows)


def front_axis(trials: pd.DataFrame) -> str:
    """The non-accuracy objective the study optimised (tokens/s when not recorded)."""
    if "objectives" in trials and len(trials):
        names = str(trials["objectives"].iloc[0]).split(",")
        others = [n for n in names if n != "accuracy" and n in METRIC_DIRECTIONS]
        if others and trials[others[0]].notna().any():
            return others[0]
    return "tokens_per_second"
