"""Prefect flows under the test harness (a temporary local server; no network), with a fake
``setdiff trial`` (a stdlib script writing a deterministic result.json) so no flow test needs
torch: end to end, kill/resume, Dask = sequential, scale-out checks, retries, the pipeline.

Only the end-to-end run holds the compute concurrency limit: with the harness's SQLite server,
re-acquiring a slot waits ~2 s (a retried 503 from a locked database), which the other flows
skip (``concurrency_limit=None``)."""

from __future__ import annotations

import os
import tempfile

# Prefect reads PREFECT_HOME when it is first imported: a private one, never ~/.prefect.
os.environ["PREFECT_HOME"] = os.environ.get("SETDIFF_TEST_PREFECT_HOME") or tempfile.mkdtemp()
os.environ["SETDIFF_TEST_PREFECT_HOME"] = os.environ["PREFECT_HOME"]
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

import contextlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import optuna  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from flows import ablation as flow  # noqa: E402
from flows import tasks  # noqa: E402
from flows.pipeline import pipeline, stage_names  # noqa: E402
from flows.runner import task_runner  # noqa: E402
from flows.tasks import CommandError, InfrastructureError, open_storage, run_cli  # noqa: E402
from setdiff.ablation.space import resolve_space  # noqa: E402
from setdiff.params import Params  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SPEC = {
    "space": {
        "set_size": {"choices": [2, 4]},
        "window": {"choices": ["D", "2D"]},
        "threshold": {"choices": ["off", 0.7]},
    },
    "constraints": {"accuracy": {"min": 0.3}},
    "budget": {"n_trials": 5, "batch": 2, "n_examples": 4, "train_steps": 10, "eval_every": 5},
    "sampler": {"name": "nsga2", "seed": 3},
}

FAKE_TRIAL = r"""
import argparse, json, os, shutil, signal, sys, time
parser = argparse.ArgumentParser()
for flag in ("--space", "--spec", "--out", "--params", "--task", "--root", "--cache"):
    parser.add_argument(flag)
args = parser.parse_args()
home = os.path.dirname(args.params)
if args.space:
    shutil.copyfile(os.path.join(home, "space.json"), args.space)
    sys.exit(0)
spec = json.load(open(args.spec))
number, knobs = spec["number"], spec["knobs"]
with open(os.path.join(home, "calls.log"), "a") as f:
    f.write(f"{number}\n")
hold, deadline = os.path.join(home, "hold"), time.monotonic() + 30
while os.path.exists(hold) and time.monotonic() < deadline:  # a long trial, until released
    time.sleep(0.05)
crash = os.path.join(home, "crash_once")
if os.path.exists(crash) and int(open(crash).read()) == number:
    os.remove(crash)
    os.kill(os.getpid(), signal.SIGKILL)
tau = 1.0 if knobs.get("threshold", "off") == "off" else knobs["threshold"]
d, w = knobs.get("set_size", 4), 2 if knobs.get("window") == "2D" else 1
if spec["trains"]:
    with open(os.path.join(args.out, "train_log.jsonl"), "w") as f:
        for step in (5, 10):
            f.write(json.dumps({"step": step, "eval_loss": 2.0 + 0.1 * d - 0.01 * step}) + "\n")
acc = round(0.3 + 0.5 * tau - 0.02 * d - 0.05 * w, 6)
result = {
    "accuracy": acc, "nfe_mean": round(40 / (d * w) + 20 * tau, 6), "tokens_per_second": 100.0,
    "tokens_per_forward": 1.0, "n": 4, "pruned": False, "paradigm": "setdlm",
    "paradigm_config": {"set_size": d}, "constraints": {"accuracy_min": 0.3 - acc},
    "decode_options": {"window": d * w, "threshold": knobs.get("threshold", "off")},
}
json.dump(result, open(os.path.join(args.out, "result.json"), "w"))
"""


@pytest.fixture(scope="session")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture(scope="session")
def fake_trial(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("fake") / "fake_trial.py"
    path.write_text(FAKE_TRIAL)
    return [sys.executable, str(path)]


def make_workspace(root: Path, spec: dict[str, Any] = SPEC) -> Path:
    """A repository root with params.yaml (smoke + ablation) and its resolved space.json."""
    root.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    data["ablation"] = spec
    (root / "params.yaml").write_text(yaml.safe_dump(data))
    space = resolve_space(Params(data, root / "params.yaml"), "arith")
    (root / "space.json").write_text(json.dumps(space))
    return root


def run(root: Path, command: list[str] | None, **kwargs: Any) -> dict[str, Any]:
    return flow.ablation(
        task="arith", params=str(root / "params.yaml"), root=str(root), command=command, **kwargs
    )


def trials_of(summary: dict[str, Any], root: Path) -> list[optuna.trial.FrozenTrial]:
    storage = open_storage(str(root / summary["storage"]))  # relative to the root
    return optuna.load_study(study_name=summary["study"], storage=storage).trials


def outcome(trials: list[optuna.trial.FrozenTrial]) -> list[tuple]:
    return [(t.number, t.state.name, t.params, t.values) for t in trials]


def listeners() -> set[str]:
    """Where this process and its children accept TCP connections (``ip:port``)."""
    me = psutil.Process()
    found = set()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add(f"{conn.laddr.ip}:{conn.laddr.port}")
    return found


def exposed(addresses: set[str]) -> set[str]:
    return {a for a in addresses if a.rsplit(":", 1)[0] not in ("127.0.0.1", "::1")}


def calls(root: Path) -> list[int]:
    path = root / "calls.log"
    return [int(n) for n in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def sequential(
    harness: None, fake_trial: list[str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    root = make_workspace(tmp_path_factory.mktemp("sequential"))
    (root / "crash_once").write_text("0")  # the default trial's process is killed once
    return root, run(root, fake_trial)


def test_ablation_flow_end_to_end(sequential: tuple[Path, dict[str, Any]]) -> None:
    root, summary = sequential
    trials = trials_of(summary, root)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    space = json.loads((root / "space.json").read_text())
    assert len(complete) == 5 and summary["counts"]["COMPLETE"] == 5
    assert trials[0].params == space["default"] and trials[0].user_attrs["default"]
    assert len({json.dumps(t.params, sort_keys=True) for t in complete}) == 5
    # Killed once (an infrastructure fault): retried, then complete.
    assert not (root / "crash_once").exists() and calls(root).count(0) == 2
    assert trials[0].state == TrialState.COMPLETE
    # The training log became Optuna intermediate values (written by the task).
    assert all(t.intermediate_values.keys() == {5, 10} for t in complete)
    export = json.loads((root / summary["export"]).read_text())
    assert export["pareto"] == summary["pareto"] != []
    assert all(t["state"] == "COMPLETE" for t in export["trials"] if t["pareto"])


def test_dask_cluster_gives_the_sequential_results(
    sequential: tuple[Path, dict[str, Any]],
    fake_trial: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, summary = sequential
    root = make_workspace(tmp_path / "dask")
    record = tmp_path / "listeners.jsonl"  # a file: Dask runs the trials on pickled copies

    def run_command(*args: Any, **kwargs: Any) -> None:
        with record.open("a") as f:  # the listeners as each command (trials included) starts
            f.write(json.dumps(sorted(listeners())) + "\n")
        return real_run_command(*args, **kwargs)

    real_run_command, before = tasks.run_command, listeners()
    monkeypatch.setattr(tasks, "run_command", run_command)
    dask = run(root, fake_trial, dask_workers=2, concurrency_limit=None)
    assert dask["study"] == summary["study"]
    assert outcome(trials_of(dask, root)) == outcome(trials_of(summary, first))
    # The Dask scheduler's and workers' HTTP servers (and Prefect's) are on loopback only.
    seen = [set(json.loads(line)) for line in record.read_text().splitlines()]
    assert any(len(now - before) >= 3 for now in seen)  # the cluster's, while trials ran
    assert set().union(*map(exposed, seen)) == set()


def test_the_dask_cluster_listens_on_loopback_only() -> None:
    before = listeners()
    with task_runner(None, 2) as runner:
        assert runner.client.cluster is not None  # the cluster starts with its client
        started = listeners() - before
    assert started and exposed(started) == set()


def test_killed_study_resumes_without_duplicates(
    harness: None, fake_trial: list[str], tmp_path: Path
) -> None:
    root = make_workspace(tmp_path / "resume")
    space = json.loads((root / "space.json").read_text())
    storage = str(root / "studies" / "arith" / "journal.log")  # a study run by hand
    study = optuna.create_study(
        study_name="killed", storage=open_storage(storage), directions=["maximize", "minimize"]
    )
    study.enqueue_trial(space["default"])
    done = study.ask()
    flow.suggest(done, space)
    study.tell(done, [0.5, 10.0])
    study.enqueue_trial({"set_size": 2, "window": "2D", "threshold": 0.7})
    flow.suggest(study.ask(), space)  # trial 1: RUNNING when the run was killed

    summary = run(root, fake_trial, study="killed", concurrency_limit=None)
    trials = trials_of(summary, root)
    assert trials[1].state == TrialState.FAIL
    retried = [t for t in trials if t.user_attrs.get("retry_of") == 1]
    assert len(retried) == 1 and retried[0].params == trials[1].params
    assert retried[0].state == TrialState.COMPLETE
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 5
    assert len({json.dumps(t.params, sort_keys=True) for t in complete}) == 5
    assert 0 not in calls(root)  # the completed trial was kept, not re-run
    assert [t.number for t in trials if t.user_attrs.get("default")] == []


def test_a_run_by_hand_leaves_the_dvc_stage_output_alone(
    sequential: tuple[Path, dict[str, Any]], fake_trial: list[str], tmp_path: Path
) -> None:
    root, summary = sequential
    assert not (root / "ablations").exists()  # the `ablate` stage's output (DVC-tracked)
    assert summary["export"] == f"studies/arith/{summary['study']}/study.json"
    assert (root / summary["export"]).exists() and (root / summary["storage"]).exists()
    asked = make_workspace(tmp_path / "asked")
    staged = run(asked, fake_trial, ablations="ablations", n_trials=1, concurrency_limit=None)
    assert staged["export"] == f"ablations/arith/{staged['study']}/study.json"
    assert (asked / staged["export"]).exists() and not (asked / "studies").exists()


def test_summary_and_export_hold_no_absolute_paths(
    sequential: tuple[Path, dict[str, Any]],
) -> None:
    root, summary = sequential
    export = (root / summary["export"]).read_text()
    for text in (json.dumps(summary), export):
        assert str(root) not in text and str(ROOT) not in text
    assert summary["storage"] == "studies/arith/journal.log"


def test_a_second_flow_on_a_running_study_is_refused(
    harness: None, fake_trial: list[str], tmp_path: Path
) -> None:
    root = make_workspace(tmp_path / "busy")
    (root / "hold").touch()  # the first flow's trials wait until the second one has been tried
    first: dict[str, Any] = {}

    def run_first() -> None:
        try:
            first["summary"] = run(root, fake_trial, concurrency_limit=None)
        except Exception as err:
            first["error"] = err

    thread = threading.Thread(target=run_first)
    thread.start()
    deadline = time.monotonic() + 120
    while not calls(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with pytest.raises(RuntimeError, match="is being run by another flow"):
            run(root, fake_trial, concurrency_limit=None)
    finally:
        (root / "hold").unlink()
        thread.join(180)
    assert "error" not in first, first
    assert first["summary"]["counts"]["COMPLETE"] == 5
    assert calls(root).count(0) == 1  # the running trial was neither failed nor re-run


def test_remote_dask_with_a_file_storage_is_a_clear_error(
    harness: None, fake_trial: list[str], tmp_path: Path
) -> None:
    root = make_workspace(tmp_path / "remote")
    with pytest.raises(ValueError, match="remote cluster.*file on this machine"):
        run(root, fake_trial, storage=str(root / "j.log"), dask_address="tcp://10.9.8.7:8786")
    with pytest.raises(ValueError, match="remote cluster"):
        run(root, fake_trial, storage="sqlite:///x.db", dask_address="tcp://10.9.8.7:8786")
    assert calls(root) == []


def test_bad_spec_fails_before_any_trial(harness: None, tmp_path: Path) -> None:
    root = make_workspace(tmp_path / "bad")
    data = yaml.safe_load((root / "params.yaml").read_text())
    data["ablation"]["space"]["windw"] = {"choices": [4]}
    (root / "params.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(CommandError, match="unknown knob"):
        run(root, None)  # the real `setdiff trial --space`
    assert not list(root.glob("*/arith/*/trials"))


def test_retries_only_for_infrastructure_faults(harness: None, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    script = "import os, signal, sys; open(sys.argv[1], 'a').write('x');"
    quick = run_cli.with_options(retry_delay_seconds=0)
    config_error = [sys.executable, "-c", script + "sys.exit(2)", str(counter)]
    with pytest.raises(CommandError):
        quick("config error", config_error, log_path=str(tmp_path / "a.log"))
    assert counter.read_text() == "x"
    killed = [sys.executable, "-c", script + "os.kill(os.getpid(), signal.SIGKILL)", str(counter)]
    with pytest.raises(InfrastructureError):
        quick("killed", killed, log_path=str(tmp_path / "b.log"))
    assert counter.read_text() == "x" + "xxx"  # one run and two retries


def test_pipeline_runs_dvc_stages_in_order(harness: None, tmp_path: Path) -> None:
    fake_dvc = tmp_path / "dvc.py"
    fake_dvc.write_text("import sys; open('repro.log', 'a').write(' '.join(sys.argv[1:]) + '\\n')")
    ran = pipeline(
        stages=["prepare", "tokenize"], root=str(tmp_path), dvc=[sys.executable, str(fake_dvc)]
    )
    assert ran == ["prepare", "tokenize"]
    assert (tmp_path / "repro.log").read_text().splitlines() == ["repro prepare", "repro tokenize"]
    assert stage_names(ROOT / "dvc.yaml")[:3] == ["prepare", "tokenize", "train_ar"]


def test_serve_defines_both_deployments(harness: None) -> None:
    from flows.serve import deployments

    assert [d.name for d in deployments()] == ["local-ablation", "local-pipeline"]


def test_flows_never_import_torch_or_setdiff() -> None:
    code = (
        "import sys, flows.ablation, flows.pipeline, flows.serve, flows.tasks\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'setdiff')]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
