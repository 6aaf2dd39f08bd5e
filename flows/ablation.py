"""The ablation flow: one Optuna study of set size, ordering and decoding on an answer task.

``ablation`` resolves the preset's ``ablation`` section with ``setdiff trial --space`` (which
validates it: a bad spec fails there, before any trial), checks that the storage suits the task
runner, and runs ``ablation-study`` on it: sequential (one thread), a local Dask cluster
(``dask_workers``) or a Dask scheduler (``dask_address``) (`flows.runner`).

Where a study lives: ``<ablations>/<task>/`` holds its journal file (the default storage; any RDB
URL for shared use), ``space.json`` and ``<study>/`` (trial directories, the export). By hand
``ablations`` is ``studies/``, outside DVC's outputs; the DVC stage ``ablate`` passes
``--ablations ablations`` (its output ``ablations/<task>``), so a study run by hand never makes
that stage stale.

``ablation-study`` opens the study (``load_if_exists``, a seeded sampler), marks trials a killed
run left RUNNING as FAIL and enqueues their params again, enqueues the preset's configuration as
the first trial, then runs rounds of ``budget.batch`` trials: ask, submit one `run_trial` task
each, tell the results in trial order (`flows.study`). At the end it exports
``<ablations>/<task>/<study>/study.json`` (every trial, the Pareto set) for ``setdiff promote``;
its paths, like the returned summary's, are relative to the repository root.

Pruning: each training trial receives the held-out loss curves of the completed trials and
applies the median rule itself (`setdiff.ablation.pruning.should_prune`, which says why Optuna's
``MedianPruner`` does not apply: multi-objective studies, ``group_by``, and a decision that must
not depend on which parallel trial finishes first); a pruned trial is told PRUNED. The curves
reach the study as intermediate values (`flows.tasks.run_trial`), so the dashboard shows them.

Run it: ``python -m flows.ablation --task arith [--dask-workers 2 | --dask-address ADDR]
[--ablations DIR]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from prefect import flow
from prefect.futures import PrefectFuture

from flows.runner import StudyBusyError, check_scale_out, lock_path, study_lock, task_runner, under
from flows.study import (
    ask_round,
    export_study,
    finished,
    open_study,
    peers,
    recover_interrupted,
    suggest,  # noqa: F401  (tests call it as flows.ablation.suggest)
    tell_round,
    write_json,
)
from flows.tasks import (
    COMPUTE_LIMIT,
    SETDIFF,
    ensure_concurrency_limit,
    run_cli,
    run_logger,
    run_trial,
)

PARAMS: tuple[str, ...] = (
    "ablation",
    "paradigm",
    "decode",
    "bench.run",
    "data.{task}",
    "tokenizer.{task}",
    "model.{task}",
    "train.{task}",
)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both);
``{task}`` and ``{paradigm}`` stand for the stage's arguments."""

TRIAL_COMMAND = (*SETDIFF, "trial")
ADHOC = "studies"
"""Where studies run by hand live (``<root>/studies/<task>/``): outside DVC's ``ablations/``."""


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
    url = storage or under(root_path, space["storage"] or f"{ablations}/{task}/journal.log")
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
        "budget": space["trial_budget"],
        "prune": None if prune is None else {"peers": peers(trial.study), **prune},
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
        write_json(summary_path, summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
