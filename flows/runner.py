"""Where a study runs: its task runner (threads or Dask), its storage check, and its lock.

One flow run drives a study at a time: a second one on the same study (same journal file, or
same study folder for an RDB URL) is refused (`StudyBusyError`) while the first holds the
study's lock; the lock goes with its process, so a killed run can be resumed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

LOOPBACK = ("localhost", "127.0.0.1", "::1")
LOCAL_HTTP = "127.0.0.1:0"
"""Where a local Dask cluster's scheduler and workers serve HTTP (/health, /metrics, ...): on
loopback, any free port. Unset, distributed binds every interface (0.0.0.0 and [::])."""


class StudyBusyError(RuntimeError):
    """Another flow run is driving the study (it holds the study's lock)."""


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
        # In-process workers talk over inproc:// (no socket); every node's HTTP server is on
        # loopback. The scheduler starts one even without a dashboard (None: no Bokeh pages).
        cluster = {
            "n_workers": dask_workers,
            "threads_per_worker": 1,
            "processes": False,
            "dashboard_address": None,
            "scheduler_kwargs": {"dashboard_address": LOCAL_HTTP},
            "worker_dashboard_address": LOCAL_HTTP,
        }
        return DaskTaskRunner(cluster_kwargs=cluster)
    return ThreadPoolTaskRunner(max_workers=1)


def under(root: Path, storage: str) -> str:
    """A relative journal path is relative to the repository root; URLs are kept."""
    return storage if "://" in storage else str(root / storage)
