"""Shared Prefect tasks: commands as subprocesses, retried only for infrastructure faults.

Every compute step is a ``setdiff`` or ``dvc`` subprocess: a fresh process per trial or stage
(clean memory, no torch in the flow). A failed command is classified from its exit status and
stderr (`classify`): configuration and value errors are deterministic (exit status 2 from
``setdiff trial``/argparse, or a traceback ending in one of `DETERMINISTIC`) and never retried;
anything else (killed by a signal or the OOM killer, a crash, a lost file system) is an
`InfrastructureError`, which the tasks retry.

``run_trial`` holds a slot of the global concurrency limit `COMPUTE_LIMIT` while its subprocess
runs, follows the trial's training log (Prefect logs, and Optuna intermediate values for the
dashboard) and returns its ``result.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import TaskRun
from prefect.concurrency.sync import concurrency
from prefect.exceptions import MissingContextError, ObjectNotFound
from prefect.states import State

COMPUTE_LIMIT = "setdiff-compute"
"""Global concurrency limit around every trial subprocess (create it with
``prefect gcl create setdiff-compute --limit N``; a flow creates it with its worker count)."""

SETDIFF = (sys.executable, "-m", "setdiff.cli")
"""How flows call the ``setdiff`` CLI (the interpreter running the flow, whatever its PATH)."""
DVC = (sys.executable, "-m", "dvc")

EXIT_CONFIG = 2
DETERMINISTIC = re.compile(
    r"^(?:[\w.]+\.)?(ConfigError|ValueError|TypeError|KeyError|IndexError|AssertionError|"
    r"FloatingPointError|FileNotFoundError|NotImplementedError|AttributeError|ImportError|"
    r"ModuleNotFoundError|JSONDecodeError)(?::|$)",
    re.MULTILINE,
)
"""Exception names that mean the same command would fail again."""


class InfrastructureError(RuntimeError):
    """A command died for reasons outside its inputs (signal, OOM, crash): worth a retry."""


class CommandError(RuntimeError):
    """A command failed deterministically (bad config, bad value, bug): never retried."""


def classify(argv: Sequence[str], returncode: int, output: str) -> RuntimeError:
    """The exception for a failed command, with the tail of its output."""
    tail = "\n".join(output.strip().splitlines()[-15:])
    message = f"`{' '.join(map(str, argv))}` exited with {returncode}:\n{tail}"
    if returncode == EXIT_CONFIG or DETERMINISTIC.search(output):
        return CommandError(message)
    return InfrastructureError(message)


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger (shown in the UI), or a plain one outside a run (unit tests)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")


def is_infrastructure_fault(task: Any, task_run: TaskRun, state: State) -> bool:
    """Prefect ``retry_condition_fn``: retry only `InfrastructureError`s."""
    return isinstance(state.data, InfrastructureError)


def run_command(
    argv: Sequence[str],
    *,
    cwd: str | Path,
    log_path: Path,
    timeout_s: float | None = None,
    on_poll: Callable[[], None] | None = None,
) -> None:
    """Run `argv` with stdout+stderr to `log_path`; raise a classified error on failure.

    `on_poll` runs about every 0.2 s while the command runs (e.g. to follow a log file).
    A command still running after `timeout_s` is killed: a `CommandError` (a budget, not a
    fault of the machine).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as sink:
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, env=_environment()
            )
        except OSError as err:  # e.g. the executable is missing on this worker
            raise InfrastructureError(f"cannot start {argv[0]}: {err}") from err
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if on_poll is not None:
                    on_poll()
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    proc.kill()
                    proc.wait()
                    raise CommandError(f"`{' '.join(argv)}` ran past {timeout_s:.0f} s") from None
    if on_poll is not None:
        on_poll()
    if proc.returncode != 0:
        raise classify(argv, proc.returncode, log_path.read_text(errors="replace"))


def _environment() -> dict[str, str]:
    """This interpreter's scripts first on PATH: DVC stages call ``setdiff`` by name."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}


def ensure_concurrency_limit(name: str, limit: int) -> None:
    """Create the global concurrency limit `name` if it does not exist (an existing one is the
    operator's setting and is left alone)."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=max(limit, 1))
            )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB URL (``scheme://...``) as is; any other string is a journal file path."""
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))


@task(
    name="dvc-repro",
    task_run_name="dvc repro {stage}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=is_infrastructure_fault,
)
def run_stage(stage: str, *, cwd: str = ".", dvc: Sequence[str] = DVC) -> None:
    """``dvc repro <stage>`` (DVC decides whether anything needs to run)."""
    logger = get_run_logger()
    log_path = Path(cwd) / ".dvc" / "tmp" / "flows" / f"{stage}.log"
    try:
        run_command([*dvc, "repro", stage], cwd=cwd, log_path=log_path)
    finally:
        if log_path.exists():
            logger.info("%s", log_path.read_text(errors="replace")[-4000:])


@task(
    name="command",
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=is_infrastructure_fault,
)
def run_cli(name: str, argv: Sequence[str], *, log_path: str, cwd: str = ".") -> None:
    """One command (e.g. ``setdiff preset smoke``), retried for infrastructure faults only."""
    try:
        run_command(argv, cwd=cwd, log_path=Path(log_path))
    finally:
        if Path(log_path).exists():
            get_run_logger().info("%s", Path(log_path).read_text(errors="replace")[-4000:])


@task(
    name="trial",
    task_run_name="trial {number}: {label}",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=is_infrastructure_fault,
)
def run_trial(
    number: int,
    label: str,
    spec: dict[str, Any],
    *,
    command: Sequence[str],
    out_dir: str,
    cwd: str = ".",
    storage: str | None = None,
    timeout_s: float | None = None,
    limit: str | None = COMPUTE_LIMIT,
) -> dict[str, Any]:
    """Run one trial subprocess (``<command> --spec trial.json --out DIR``) inside the global
    concurrency limit `limit` (None: none) and return its ``result.json``.

    Each held-out loss line of ``DIR/train_log.jsonl`` is logged and, given `storage`, written
    to the study as the trial's intermediate value (learning curves in optuna-dashboard; the
    next rounds' pruning reference).
    """
    logger = get_run_logger()
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)  # a retry starts clean
    out.mkdir(parents=True)
    _write_json(out / "trial.json", spec)
    report = _follower(out / "train_log.jsonl", spec, storage, logger)
    argv = [*command, "--spec", str(out / "trial.json"), "--out", str(out)]
    logger.info("trial %d: %s", number, json.dumps(spec["knobs"]))
    with concurrency(limit, occupy=1) if limit else contextlib.nullcontext():
        run_command(argv, cwd=cwd, log_path=out / "trial.log", timeout_s=timeout_s, on_poll=report)
    result = json.loads((out / "result.json").read_text())
    metrics = {k: result.get(k) for k in ("accuracy", "tokens_per_second", "nfe_mean")}
    logger.info("trial %d: %s", number, "pruned" if result["pruned"] else metrics)
    return result


def _follower(
    log_path: Path, spec: dict[str, Any], storage: str | None, logger: Any
) -> Callable[[], None]:
    """A poll callback that reports the new lines of a training log."""
    seen = 0
    target: tuple[optuna.storages.BaseStorage, int] | None = None

    def report() -> None:
        nonlocal seen, target
        if not log_path.exists():
            return
        lines = [line for line in log_path.read_text().splitlines() if line.endswith("}")]
        for line in lines[seen:]:
            step, loss = _point(json.loads(line))
            logger.info("trial %d: step %d held-out loss %.4f", spec["number"], step, loss)
            if storage is not None:
                if target is None:
                    opened = open_storage(storage)
                    study_id = opened.get_study_id_from_name(spec["study"])
                    number = spec["number"]
                    target = (
                        opened,
                        opened.get_trial_id_from_study_id_trial_number(study_id, number),
                    )
                target[0].set_trial_intermediate_value(target[1], step, loss)
        seen = len(lines)

    return report


def _point(record: dict[str, Any]) -> tuple[int, float]:
    return int(record["step"]), float(record["eval_loss"])


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
