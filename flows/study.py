"""The Optuna side of an ablation study: open it, ask a round, tell a round, export it.

The space comes from ``setdiff trial --space`` as JSON (`setdiff.ablation.space.SearchSpace`); this
package cannot import `setdiff`, so it reads that record's fields by name. A knob's condition is
data there (``when``: each named value must be one of the listed ones, computed by
`setdiff.ablation.knobs.Knob.when`, the one definition); `suggest` only matches it.

A study is the same sequentially and on Dask: `ask_round` asks a whole round before any result
is told, and `tell_round` tells the results in trial order. Proposals that repeat a finished
trial are told FAIL (``duplicate``) and replaced by an untried grid point, so no configuration
runs twice. Constraints (e.g. an accuracy floor) are set with ``Trial.set_constraint`` (Optuna 5;
``constraints_func`` is deprecated there), which both samplers and ``best_trials`` honour.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
from optuna.trial import TrialState
from prefect.artifacts import create_table_artifact
from prefect.futures import PrefectFuture

from flows.tasks import open_storage, run_logger

METRICS = ("accuracy", "tokens_per_second", "nfe_mean", "tokens_per_forward", "n")
EXPORTED = ("paradigm", "paradigm_config", "decode_options", "metrics", "default", "retry_of")
EXPORTED += ("duplicate", "pruned_at", "error")


def open_study(space: dict[str, Any], storage: str, name: str) -> optuna.Study:
    directions = [o["direction"] for o in space["objectives"]]
    study = optuna.create_study(
        study_name=name, storage=open_storage(storage), directions=directions, load_if_exists=True
    )
    if [d.name.lower() for d in study.directions] != directions:
        raise ValueError(f"study {name!r} exists in {storage} with other objectives")
    # Offset by the trials so far: a resumed run must not replay the first run's proposals.
    seed = space["sampler"]["seed"] + len(study.trials)
    if space["sampler"]["name"] == "nsga2":
        population = space["budget"]["batch"]
        study.sampler = optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
    else:
        study.sampler = optuna.samplers.TPESampler(seed=seed)
    return study


def recover_interrupted(study: optuna.Study) -> None:
    """Trials left RUNNING by a killed run: FAIL them and enqueue their params again (once).

    One flow run drives a study at a time; parallelism comes from its task runner.
    """
    trials = study.get_trials(deepcopy=False)
    waiting = {_key(t.system_attrs.get("fixed_params", {})) for t in trials if _is(t, "WAITING")}
    for trial in trials:
        if trial.state != TrialState.RUNNING:
            continue
        if trial.params and _key(trial.params) not in waiting:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        study.tell(trial.number, state=TrialState.FAIL)
        run_logger().warning("trial %d was interrupted: FAIL, enqueued again", trial.number)


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def ask_round(study: optuna.Study, space: dict[str, Any], size: int) -> list[optuna.Trial]:
    """`size` new trials with configurations no finished or running trial has."""
    taken = {_key(t.params) for t in study.get_trials(deepcopy=False) if _is(t, "COMPLETE")}
    taken |= {_key(t.params) for t in study.get_trials(deepcopy=False) if _is(t, "PRUNED")}
    trials: list[optuna.Trial] = []
    for _ in range(20 * size):  # bounded: a sampler may keep proposing taken points
        if len(trials) == size:
            break
        trial = study.ask()
        params = suggest(trial, space)
        if _key(params) not in taken:
            taken.add(_key(params))
            trials.append(trial)
            continue
        trial.set_user_attr("duplicate", True)
        study.tell(trial, state=TrialState.FAIL)
        untried = [p for p in space["grid"] or [] if _key(p) not in taken]
        if space["grid"] is not None and not untried:
            break
        if untried:
            study.enqueue_trial(untried[0])
    return trials


def suggest(trial: optuna.Trial, space: dict[str, Any]) -> dict[str, Any]:
    """Define-by-run: each knob whose ``when`` holds given the values chosen before it."""
    values: dict[str, Any] = {}
    for knob in space["knobs"]:
        seen = {**space["context"], **values}
        if any(seen.get(other) not in allowed for other, allowed in knob["when"].items()):
            continue
        name, spec = knob["name"], knob["spec"]
        if spec["choices"] is not None:
            values[name] = trial.suggest_categorical(name, spec["choices"])
        elif knob["integer"]:
            low, high, step = int(spec["low"]), int(spec["high"]), int(spec["step"] or 1)
            values[name] = trial.suggest_int(name, low, high, step=step, log=spec["log"])
        else:
            values[name] = trial.suggest_float(
                name, spec["low"], spec["high"], step=spec["step"], log=spec["log"]
            )
    return values


def tell_round(
    study: optuna.Study,
    space: dict[str, Any],
    trials: Sequence[optuna.Trial],
    futures: Sequence[PrefectFuture],
) -> int:
    """Tell every trial of a round, in trial order; returns how many failed."""
    logger, failures = run_logger(), 0
    for trial, future in zip(trials, futures, strict=True):
        try:
            result = future.result()
        except Exception as err:  # the task's final error, after any retries
            logger.error("trial %d failed: %s", trial.number, err)
            trial.set_user_attr("error", str(err)[-2000:])
            study.tell(trial, state=TrialState.FAIL)
            failures += 1
            continue
        for key in ("paradigm", "paradigm_config", "decode_options"):
            trial.set_user_attr(key, result[key])
        if result["pruned"]:
            trial.set_user_attr("pruned_at", result["pruned_at"])
            study.tell(trial, state=TrialState.PRUNED)
            continue
        trial.set_user_attr("metrics", {k: result[k] for k in METRICS})
        for key, value in result["constraints"].items():
            trial.set_constraint(key, value)
        study.tell(trial, [result[o["name"]] for o in space["objectives"]])
    return failures


def export_study(
    study: optuna.Study, space: dict[str, Any], storage: str, path: Path, root: Path
) -> dict[str, Any]:
    """Write ``study.json`` (what `setdiff promote` reads) and a Pareto table for the UI; paths
    in it are relative to `root` (the same run gives the same file on any machine)."""
    names = [o["name"] for o in space["objectives"]]
    pareto = sorted(t.number for t in study.best_trials)
    trials = [
        {
            "number": t.number,
            "state": t.state.name,
            "params": t.params,
            "values": dict(zip(names, t.values, strict=True)) if t.values else None,
            "constraints": t.constraints,
            "pareto": t.number in pareto,
            **{k: t.user_attrs[k] for k in EXPORTED if k in t.user_attrs},
        }
        for t in study.trials
    ]
    states = [t["state"] for t in trials]
    summary = {
        "study": study.study_name,
        "task": space["task"],
        "preset": space["preset"],
        "storage": portable(storage, root),
        "objectives": space["objectives"],
        "constraints": space["constraints"],
        "pareto": pareto,
        "counts": {s: states.count(s) for s in sorted(set(states))},
    }
    write_json(path, {**summary, "trials": trials})
    rows = [{"trial": t["number"], **t["params"], **t["values"]} for t in trials if t["pareto"]]
    key = re.sub(r"[^a-z0-9-]+", "-", f"pareto-{study.study_name}".lower())
    create_table_artifact(rows, key=key, description=f"Pareto set of {study.study_name}")
    run_logger().info(
        "Pareto set %s; promote with: setdiff promote --task %s --study %s --preset %s "
        "--ablations %s",
        pareto,
        space["task"],
        study.study_name,
        space["preset"],
        portable(str(path.parents[2]), root),
    )
    return {**summary, "export": portable(str(path), root)}


def peers(study: optuna.Study) -> list[dict[str, Any]]:
    """Completed trials' knobs and held-out loss curves (the pruning rule's reference)."""
    return [
        {"knobs": t.params, "curve": sorted([s, v] for s, v in t.intermediate_values.items())}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.intermediate_values
    ]


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically (a reader never sees a partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _is(trial: optuna.trial.FrozenTrial, state: str) -> bool:
    return trial.state == TrialState[state]


def portable(location: str, root: Path) -> str:
    """A path relative to `root` when under it; a URL without its password."""
    if "://" not in location:
        path = Path(location)
        return str(path.relative_to(root)) if path.is_relative_to(root) else location
    parts = urlsplit(location)
    if parts.password is None:
        return location
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
