"""The ablation flow: one Optuna study of set size, ordering and decoding on an answer task.

``ablation`` resolves the preset's ``ablation`` section with ``setdiff trial --space`` (which
validates it: a bad spec fails there, before any trial), checks that the storage suits the task
runner, and runs ``ablation-study`` on it: sequential (one thread), a local Dask cluster
(``dask_workers``) or a Dask scheduler (``dask_address``).

Where a study lives: ``<ablations>/<task>/`` holds its journal file (the default storage; any RDB
URL for shared use), ``space.json`` and ``<study>/`` (trial directories, the export). By hand
``ablations`` is ``studies/``, outside DVC's outputs; the DVC stage ``ablate`` passes
``--ablations ablations`` (its output ``ablations/<task>``), so a study run by hand never makes
that stage stale. One flow run drives a study at a time: a second one on the same study (same
journal file, or same study folder for an RDB URL) is refused (`StudyBusyError`) while the
first holds the study's lock; the lock goes with its process, so a killed run can be resumed.

``ablation-study`` opens the study (``load_if_exists``), marks trials a killed run left RUNNING
as FAIL and enqueues their params again, enqueues the preset's configuration as the first trial,
then runs rounds of ``budget.batch`` trials: ask, submit one `run_trial` task each, tell the
results in trial order. Because the sampler only sees results between rounds, a study is the
same sequentially and on Dask. Proposals that repeat a finished trial are told FAIL
(``duplicate``) and replaced by an untried grid point, so no configuration runs twice. At the end
it exports
``<ablations>/<task>/<study>/study.json`` (every trial, the Pareto set) for ``setdiff promote``;
its paths, like the returned summary's, are relative to the repository root.

Pruning: Optuna cannot prune multi-objective trials (``Trial.should_prune`` raises), so each
training trial receives the held-out loss curves of the completed trials and applies the median
rule itself (`setdiff.ablation.should_prune`); a pruned trial is told PRUNED. Constraints (e.g.
an accuracy floor) are set with ``Trial.set_constraint`` (Optuna 5; ``constraints_func`` is
deprecated there), which both samplers and ``best_trials`` honour.

Run it: ``python -m flows.ablation --task arith [--dask-workers 2 | --dask-address ADDR]
[--ablations DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
from optuna.trial import TrialState
from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

from flows.tasks import (
    COMPUTE_LIMIT,
    SETDIFF,
    ensure_concurrency_limit,
    open_storage,
    run_cli,
    run_logger,
    run_trial,
)

TRIAL_COMMAND = (*SETDIFF, "trial")
METRICS = ("accuracy", "tokens_per_second", "nfe_mean", "tokens_per_forward", "n")
EXPORTED = ("paradigm", "paradigm_config", "decode_options", "metrics", "default", "retry_of")
EXPORTED += ("duplicate", "pruned_at", "error")
LOOPBACK = ("localhost", "127.0.0.1", "::1")
ADHOC = "studies"
"""Where studies run by hand live (``<root>/studies/<task>/``): outside DVC's ``ablations/``."""


class StudyBusyError(RuntimeError):
    """Another flow run is driving the study (it holds the study's lock)."""


@flow(name="ablation")
def ablation(
    task: str = "arith",
    params: str = "params.yaml",
    root: str = ".",
    ablations: str = ADHOC,
    study: str | None = None,
    storage: str | None = None,
    n_trials: int | None = None,
    dask_address: str | None = None,
    dask_workers: int = 0,
    command: list[str] | None = None,
    concurrency_limit: str | None = COMPUTE_LIMIT,
) -> dict[str, Any]:
    """One study: resolve the space, pick the task runner, run the rounds, export the result.

    Args:
        params: the preset file (its ``ablation`` section is the study).
        root: the repository root (``data/``, ``models/``).
        ablations: the folder, under `root`, of ``<task>/`` study folders; the DVC stage passes
            ``ablations`` (its output), by hand it is ``studies`` (DVC's record stays as it is).
        study, storage, n_trials: override the section's values.
        dask_address: a Dask scheduler; a remote one needs an RDB storage every worker reaches.
        dask_workers: > 0 = a local Dask cluster of this many workers (threads: each trial is
            its own subprocess).
        command: the trial command (default ``setdiff trial``); tests substitute a fake one.
        concurrency_limit: the global concurrency limit every trial holds a slot of (created
            with ``max(dask_workers, 1)`` slots if missing); None = none.
    """
    check_scale_out(storage, dask_address)
    root_path = Path(root).resolve()
    folder = root_path / ablations / task
    base = [*(command or TRIAL_COMMAND), "--task", task, "--params", str(Path(params).resolve())]
    base += ["--root", str(root_path)]
    space = resolve_space(base, folder)
    url = storage or _under(root_path, space["storage"] or f"{ablations}/{task}/journal.log")
    check_scale_out(url, dask_address)
    name = study or space["study"]
    rounds = study_rounds.with_options(task_runner=task_runner(dask_address, dask_workers))
    with study_lock(lock_path(url, folder / name), name):
        return rounds(
            space,
            url,
            name,
            n_trials or space["budget"]["n_trials"],
            command=base,
            root=str(root_path),
            folder=str(folder),
            workers=max(dask_workers, 1),
            limit=concurrency_limit,
        )


@flow(name="ablation-study", flow_run_name="{study_name}")
def study_rounds(
    space: dict[str, Any],
    storage: str,
    study_name: str,
    n_trials: int,
    *,
    command: list[str],
    root: str,
    folder: str,
    workers: int = 1,
    limit: str | None = COMPUTE_LIMIT,
) -> dict[str, Any]:
    """Resume or start the study and run rounds until `n_trials` trials finished; its trials
    and export go to ``folder/<study_name>``."""
    logger = run_logger()
    if limit is not None:
        ensure_concurrency_limit(limit, workers)
    study = open_study(space, storage, study_name)
    recover_interrupted(study)
    if not study.trials:
        study.enqueue_trial(space["default"], user_attrs={"default": True})
    study_folder = Path(folder) / study_name
    deadline, failures = time.monotonic() + space["budget"]["timeout_s"], 0
    while (left := n_trials - len(finished(study))) > 0:
        if time.monotonic() > deadline:
            logger.warning("budget.timeout_s reached with %d trials left; re-run to go on", left)
            break
        trials = ask_round(study, space, min(space["budget"]["batch"], left))
        if not trials:
            logger.warning("every configuration of the space has been tried")
            break
        futures = [
            submit_trial(t, space, study_folder, storage, command, root, limit) for t in trials
        ]
        failures += tell_round(study, space, trials, futures)
        if failures >= max(3, space["budget"]["batch"]):
            raise RuntimeError(f"{failures} trials failed; see the trial logs under {study_folder}")
    return export_study(study, space, storage, study_folder / "study.json", Path(root))


def resolve_space(base: list[str], folder: Path) -> dict[str, Any]:
    """``setdiff trial --space``: validate the spec (before any trial) and read it back."""
    path = folder / "space.json"
    run_cli("resolve space", [*base, "--space", str(path)], log_path=str(folder / "space.log"))
    return json.loads(path.read_text())


def lock_path(storage: str, study_folder: Path) -> Path:
    """The study's lock file: beside its journal file (any flow using that journal sees it), or
    in the study folder for an RDB URL (flows of this checkout; one machine drives a study)."""
    if "://" in storage:
        return study_folder / ".flow.lock"
    journal = Path(storage)
    return journal.with_name(f".{journal.name}.{study_folder.name}.lock")


@contextlib.contextmanager
def study_lock(path: Path, study: str) -> Iterator[None]:
    """Hold `study`'s lock (flock, released when the holder exits, even when killed) or raise
    `StudyBusyError` naming its holder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StudyBusyError(
                f"study {study!r} is being run by another flow ({holder}; lock {path}): wait "
                "for it to finish, or give another --study"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        yield


def check_scale_out(storage: str | None, dask_address: str | None) -> None:
    """A remote Dask cluster needs a storage server: its trials report to the study."""
    if storage is None or not dask_address:
        return
    address = dask_address if "://" in dask_address else f"tcp://{dask_address}"
    host = urlsplit(address).hostname or ""
    is_file = "://" not in storage or storage.startswith("sqlite")
    if is_file and host not in LOOPBACK and not host.startswith("127."):
        raise ValueError(
            f"dask_address {dask_address!r} is a remote cluster but storage {storage!r} is a "
            "file on this machine (journal file or SQLite): trials on other machines report to "
            "the study, so give an RDB URL every worker can reach (e.g. "
            "postgresql://user@host/optuna), or run the Dask cluster on this machine"
        )


def task_runner(dask_address: str | None, dask_workers: int) -> TaskRunner:
    if dask_address:
        return DaskTaskRunner(address=dask_address)
    if dask_workers > 0:
        cluster = {"n_workers": dask_workers, "threads_per_worker": 1, "processes": False}
        return DaskTaskRunner(cluster_kwargs={**cluster, "dashboard_address": None})
    return ThreadPoolTaskRunner(max_workers=1)


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
    """Define-by-run: each knob that applies given the values chosen before it."""
    values: dict[str, Any] = {}
    for knob in space["knobs"]:
        seen = {**space["context"], **values}
        if seen["paradigm"] not in knob["paradigms"] or any(
            seen.get(other) not in allowed for other, allowed in knob["requires"].items()
        ):
            continue
        name, log = knob["name"], knob.get("log", False)
        if "choices" in knob:
            values[name] = trial.suggest_categorical(name, knob["choices"])
        elif knob["int"]:
            low, high, step = int(knob["low"]), int(knob["high"]), int(knob.get("step", 1))
            values[name] = trial.suggest_int(name, low, high, step=step, log=log)
        else:
            values[name] = trial.suggest_float(
                name, knob["low"], knob["high"], step=knob.get("step"), log=log
            )
    return values


def submit_trial(
    trial: optuna.Trial,
    space: dict[str, Any],
    folder: Path,
    storage: str,
    command: list[str],
    root: str,
    limit: str | None,
) -> PrefectFuture:
    prune = space["pruning"] if space["trains"] else None
    spec = {
        "study": trial.study.study_name,
        "number": trial.number,
        "task": space["task"],
        "knobs": trial.params,
        "trains": space["trains"],
        "budget": space["budget"],
        "prune": None if prune is None else {"peers": _peers(trial.study), **prune},
        "constraints": space["constraints"],
    }
    return run_trial.submit(
        trial.number,
        " ".join(f"{k}={v}" for k, v in trial.params.items()),
        spec,
        command=[*command, "--cache", str(folder / "models")],
        out_dir=str(folder / "trials" / f"{trial.number:04d}"),
        cwd=root,
        storage=storage,
        timeout_s=space["budget"]["timeout_s"],
        limit=limit,
    )


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
    _write_json(path, {**summary, "trials": trials})
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


def _write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically (a reader never sees a partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _peers(study: optuna.Study) -> list[dict[str, Any]]:
    """Completed trials' knobs and held-out loss curves (the pruning rule's reference)."""
    return [
        {"knobs": t.params, "curve": sorted([s, v] for s, v in t.intermediate_values.items())}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.intermediate_values
    ]


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


def _under(root: Path, storage: str) -> str:
    """A relative journal path is relative to the repository root; URLs are kept."""
    return storage if "://" in storage else str(root / storage)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.ablation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", default="arith")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    parser.add_argument(
        "--ablations",
        default=ADHOC,
        help=f"folder of <task>/ study folders under --root (default {ADHOC}/, outside DVC's "
        "outputs; the ablate stage passes ablations)",
    )
    parser.add_argument("--study", help="study name (default: derived from the spec)")
    parser.add_argument("--storage", help="RDB URL or journal file (default: the spec's)")
    parser.add_argument("--n-trials", type=int, help="finished trials to reach")
    parser.add_argument("--dask-address", help="Dask scheduler address (tcp://host:8786)")
    parser.add_argument("--dask-workers", type=int, default=0, help="local Dask workers")
    parser.add_argument("--summary", type=Path, help="also write the summary JSON here (DVC)")
    args = vars(parser.parse_args(argv))
    summary_path = args.pop("summary")
    try:
        summary = ablation(**args)
    except StudyBusyError as err:
        sys.exit(f"python -m flows.ablation: {err}")
    if summary_path is not None:
        _write_json(summary_path, summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
