"""Ablation studies: the spec (validation before any trial), trial resolution, the pruning rule,
the Optuna wiring of the flow's helpers (no Prefect server: plain functions, fake futures), the
subprocess classification, and ``setdiff promote``."""

from __future__ import annotations

import os
import tempfile

# Prefect reads PREFECT_HOME when it is first imported: a private one, never ~/.prefect.
os.environ["PREFECT_HOME"] = os.environ.get("SETDIFF_TEST_PREFECT_HOME") or tempfile.mkdtemp()
os.environ["SETDIFF_TEST_PREFECT_HOME"] = os.environ["PREFECT_HOME"]
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

import copy  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import optuna  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from flows import ablation as flow  # noqa: E402
from flows.tasks import CommandError, InfrastructureError, classify, run_command  # noqa: E402
from setdiff.ablation.pruning import should_prune  # noqa: E402
from setdiff.ablation.space import resolve_space, validate_ablation  # noqa: E402
from setdiff.ablation.trial import resolve_trial, summarize  # noqa: E402
from setdiff.config import ConfigError  # noqa: E402
from setdiff.params import Params  # noqa: E402
from setdiff.stages import promote, trial  # noqa: E402
from setdiff.study import StudyConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SPEC: dict[str, Any] = {
    "space": {
        "set_size": {"choices": [2, 4]},
        "window": {"choices": ["D", "2D"]},
        "threshold": {"choices": ["off", 0.7]},
    },
    "objectives": ["accuracy", "nfe_mean"],
    "constraints": {"accuracy": {"min": 0.3}},
    "budget": {"n_trials": 4, "batch": 2, "n_examples": 4, "train_steps": 10, "eval_every": 5},
    "sampler": {"name": "nsga2", "seed": 0},
    "pruning": {"min_trials": 2, "warmup_steps": 5},
}


def preset(edit: Callable[[dict], Any] | None = None, spec: dict | None = None) -> Params:
    """The smoke preset with an `ablation` section (optionally edited)."""
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    data["ablation"] = copy.deepcopy(spec or SPEC)
    if edit is not None:
        edit(data)
    return Params(data, Path("params/test.yaml"))


def test_space_resolves_with_the_preset_default_first_and_every_point() -> None:
    space = resolve_space(preset(), "arith")
    assert space["default"] == {"set_size": 4, "window": "D", "threshold": "off"}
    assert len(space["grid"]) == 8 and space["default"] in space["grid"]
    assert space["trains"] and space["storage"] is None  # the flow's study folder decides
    assert space["study"].startswith("arith-smoke-")
    # n_trials and the timeout are budget, not identity: raising them continues the study.
    more = preset(lambda d: d["ablation"]["budget"].update(n_trials=8, timeout_s=9.0))
    assert resolve_space(more, "arith")["study"] == space["study"]
    other = preset(lambda d: d["ablation"]["budget"].update(train_steps=11))
    assert resolve_space(other, "arith")["study"] != space["study"]


def _space(**knobs: Any) -> Callable[[dict], None]:
    return lambda d: d["ablation"]["space"].update(knobs)


BAD = {
    "unknown knob": (_space(windw={"choices": [4]}), r"unknown knob.*windw"),
    "empty choices": (_space(threshold={"choices": []}), r"space.*empty range"),
    "empty range": (_space(exponent={"low": 0.5, "high": 0.5}), r"exponent.*empty range"),
    "W > s_max": (_space(window={"choices": ["D", "3D"]}), r"window W=.*exceeds.*s_max"),
    "W > s_max (ints)": (_space(window={"choices": [4, 6]}), r"W=6 exceeds.*s_max=4"),
    "s_max < D": (
        _space(max_set_size={"choices": [3, "2D"]}, window={"choices": ["D"]}),
        r"max_set_size must be >= set_size",
    ),
    "tau range end": (_space(threshold={"low": 0.5, "high": 1.5}), r"threshold must be in"),
    "bad word": (_space(order={"choices": ["sliding", "random"]}), r"order.*'random'"),
    "default outside": (_space(window={"choices": ["2D"]}), r"preset's window = 4 is not in"),
    "too many trials": (
        lambda d: d["ablation"]["budget"].update(n_trials=9),
        r"n_trials=9 exceeds the 8 distinct",
    ),
    "unknown metric": (lambda d: d["ablation"].update(objectives=["bleu"]), r"unknown metric"),
    "nsga2 batch": (lambda d: d["ablation"]["budget"].update(batch=1), r"batch >= 2"),
    "never applies": (
        lambda d: d["ablation"]["space"].update(
            paradigm={"choices": ["bd3lm"]}, window={"choices": [2]}
        ),
        r"space.window never applies",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_specs_fail_before_any_trial_naming_the_problem(case: str) -> None:
    edit, pattern = BAD[case]
    with pytest.raises(ConfigError, match=pattern):
        resolve_space(preset(edit), "arith")


def test_validate_ablation_checks_paradigms_against_the_study() -> None:
    params = preset(_space(paradigm={"choices": ["setdlm", "bd3lm"]}))
    validate_ablation(params, StudyConfig(tasks=("arith", "text")))
    study = StudyConfig(tasks=("arith",), paradigms=("ar", "setdlm"), diffusion=("setdlm",))
    with pytest.raises(ConfigError, match=r"paradigm\(s\) \['bd3lm'\] are not in the study"):
        validate_ablation(params, study)
    with pytest.raises(ConfigError, match="answer task"):
        validate_ablation(params, StudyConfig(tasks=("text",)))


def test_resolve_trial_maps_knobs_onto_paradigm_config_and_decode_options() -> None:
    params = preset()
    plan = resolve_trial(params, {"set_size": 2, "window": "2D", "threshold": 0.7})
    assert plan.config.set_size == 2 and plan.options == {"window": 4, "threshold": 0.7}
    plan = resolve_trial(params, {"set_size": 2, "max_set_size": "3D", "order": "any"})
    assert plan.config.max_set_size == 6 and plan.options["window"] == "all"
    plan = resolve_trial(params, {"paradigm": "bd3lm", "set_size": 8, "threshold": "off"})
    assert plan.config.block_size == 8 and plan.options["threshold"] == "off"
    with pytest.raises(ConfigError, match="not for bd3lm.*window"):
        resolve_trial(params, {"paradigm": "bd3lm", "window": 2})


def test_median_pruning_rule() -> None:
    peers = [
        {"knobs": {"set_size": 2}, "curve": [[5, 1.0], [10, 0.5]]},
        {"knobs": {"set_size": 2, "window": "2D"}, "curve": [[5, 1.0], [10, 0.5]]},  # cached
        {"knobs": {"set_size": 4}, "curve": [[5, 2.0], [10, 1.5]]},
    ]
    rule = {"min_trials": 2, "warmup_steps": 5}
    assert should_prune(10, 1.2, {"set_size": 8}, peers, **rule)  # above median(0.5, 1.5)
    assert not should_prune(10, 0.9, {"set_size": 8}, peers, **rule)
    assert not should_prune(4, 9.0, {"set_size": 8}, peers, **rule)  # warm-up
    assert not should_prune(7, 9.0, {"set_size": 8}, peers, **rule)  # nobody logged step 7
    # The repeated (cached) curve counts once: only one comparable curve for D = 2.
    assert not should_prune(10, 9.0, {"set_size": 2}, peers, **rule, group_by=["set_size"])
    assert should_prune(10, float("nan"), {"set_size": 2}, [], **rule)


def test_summary_of_rows() -> None:
    rows = [
        SimpleNamespace(exact=1.0, new_tokens=6, nfe=3, latency_s=0.5),
        SimpleNamespace(exact=0.0, new_tokens=4, nfe=5, latency_s=0.5),
    ]
    assert summarize(rows) == {
        "accuracy": 0.5,
        "tokens_per_second": 10.0,
        "nfe_mean": 4.0,
        "tokens_per_forward": 10 / 8,
        "n": 2,
    }


def test_space_command_writes_json_and_exits_2_on_a_bad_spec(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(dict(preset())))
    out = tmp_path / "space.json"
    trial.main(["--task", "arith", "--params", str(params), "--space", str(out)])
    assert json.loads(out.read_text())["default"]["window"] == "D"
    params.write_text(yaml.safe_dump(dict(preset(_space(windw={"choices": [4]})))))
    with pytest.raises(SystemExit) as exit_info:
        trial.main(["--task", "arith", "--params", str(params), "--space", str(out)])
    assert exit_info.value.code == trial.EXIT_CONFIG


# --------------------------------------------------------------------------------------------
# The flow's helpers on a real (in-memory) Optuna study, without Prefect


class Done:
    """A finished future (what `tell_round` reads)."""

    def __init__(self, result: dict | Exception) -> None:
        self._result = result

    def result(self) -> dict:
        if isinstance(self._result, Exception):
            raise self._result
        return self._result


def _result(acc: float, nfe: float, **extra: Any) -> dict[str, Any]:
    metrics = {"accuracy": acc, "nfe_mean": nfe, "tokens_per_second": 1.0}
    base = {"paradigm": "setdlm", "paradigm_config": {}, "decode_options": {}, "pruned": False}
    metrics |= {"tokens_per_forward": 1.0, "n": 4}
    return {**base, **metrics, "constraints": {"accuracy_min": 0.3 - acc}, **extra}


def test_ask_suggest_and_tell_round_with_constraints_pruning_and_failures() -> None:
    space = resolve_space(preset(), "arith")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.sampler = optuna.samplers.NSGAIISampler(population_size=2, seed=0)
    study.enqueue_trial(space["default"])
    trials = flow.ask_round(study, space, 4)
    assert trials[0].params == space["default"]
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 4
    futures = [
        Done(_result(0.9, 10.0)),  # feasible, Pareto
        Done(_result(0.1, 1.0)),  # below the accuracy floor: infeasible
        Done({**_result(0, 0), "pruned": True, "pruned_at": 5}),
        Done(CommandError("boom")),
    ]
    assert flow.tell_round(study, space, trials, futures) == 1
    ran = [t for t in study.trials if "duplicate" not in t.user_attrs]  # repeats: told FAIL
    assert [t.state.name for t in ran] == ["COMPLETE", "COMPLETE", "PRUNED", "FAIL"]
    assert [t.number for t in study.best_trials] == [0]  # the infeasible one is excluded
    assert study.trials[0].user_attrs["metrics"]["accuracy"] == 0.9


def test_ask_round_never_repeats_a_finished_configuration() -> None:
    space = resolve_space(preset(), "arith")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.sampler = optuna.samplers.NSGAIISampler(population_size=2, seed=0)
    seen = set()
    for _ in range(4):  # 8 grid points, 2 per round: duplicates are replaced by untried points
        trials = flow.ask_round(study, space, 2)
        flow.tell_round(study, space, trials, [Done(_result(0.5, 5.0))] * len(trials))
        seen |= {json.dumps(t.params, sort_keys=True) for t in trials}
    assert len(seen) == 8
    assert flow.ask_round(study, space, 2) == []  # exhausted


def test_recover_interrupted_fails_and_requeues_running_trials_once() -> None:
    space = resolve_space(preset(), "arith")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({"set_size": 2, "window": "2D", "threshold": 0.7})
    flow.suggest(study.ask(), space)  # left RUNNING by a "killed" run
    flow.recover_interrupted(study)
    flow.recover_interrupted(study)  # idempotent
    states = [(t.state.name, t.user_attrs.get("retry_of")) for t in study.trials]
    assert states == [("FAIL", None), ("WAITING", 0)]
    assert flow.ask_round(study, space, 1)[0].params == study.trials[0].params


def test_scale_out_check() -> None:
    flow.check_scale_out("ablations/j.log", "tcp://127.0.0.1:8786")  # one machine: fine
    flow.check_scale_out("postgresql://u@db/optuna", "tcp://10.0.0.5:8786")
    for storage in ("ablations/j.log", "sqlite:///ablations/study.db"):
        with pytest.raises(ValueError, match="remote cluster.*RDB URL"):
            flow.check_scale_out(storage, "tcp://10.0.0.5:8786")


# --------------------------------------------------------------------------------------------
# Subprocesses: which failures are retried


def test_failures_are_classified_for_retries(tmp_path: Path) -> None:
    assert isinstance(classify(["x"], 2, "usage"), CommandError)
    trace = "Traceback (most recent call last):\nsetdiff.config.ConfigError: bad key\n"
    assert isinstance(classify(["x"], 1, trace), CommandError)
    assert isinstance(classify(["x"], 1, "Traceback...\nValueError: no"), CommandError)
    assert isinstance(classify(["x"], -signal.SIGKILL, ""), InfrastructureError)
    assert isinstance(classify(["x"], 1, "OSError: [Errno 5] Input/output error"), RuntimeError)
    assert isinstance(classify(["x"], 1, "RuntimeError: NCCL timeout"), InfrastructureError)
    log = tmp_path / "out.log"
    kill = f"import os, signal; os.kill(os.getpid(), {int(signal.SIGKILL)})"
    with pytest.raises(InfrastructureError):
        run_command([sys.executable, "-c", kill], cwd=tmp_path, log_path=log)
    with pytest.raises(CommandError, match="ran past"):
        run_command([sys.executable, "-c", "import time; time.sleep(5)"], cwd=".", log_path=log,
                    timeout_s=0.3)  # fmt: skip
    polls: list[int] = []
    run_command([sys.executable, "-c", "print(1)"], cwd=".", log_path=log,
                on_poll=lambda: polls.append(1))  # fmt: skip
    assert log.read_text().strip() == "1" and polls


# --------------------------------------------------------------------------------------------
# setdiff promote


def _export(tmp_path: Path, trials: list[dict]) -> None:
    folder = tmp_path / "ablations" / "arith" / "s1"
    folder.mkdir(parents=True)
    pareto = [t["number"] for t in trials if t.get("pareto", True)]
    study = {"study": "s1", "pareto": pareto, "trials": trials}
    (folder / "study.json").write_text(json.dumps(study))


def _trial(number: int, acc: float, set_size: int, window: int, tau: Any) -> dict[str, Any]:
    return {
        "number": number,
        "state": "COMPLETE",
        "params": {"set_size": set_size, "window": "D", "threshold": tau},
        "paradigm": "setdlm",
        "paradigm_config": {"set_size": set_size, "max_set_size": None, "exponent": None},
        "decode_options": {"window": window, "threshold": tau},
        "metrics": {"accuracy": acc},
    }


def test_promote_writes_pareto_configs_keeping_comments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params").mkdir()
    source = (ROOT / "params" / "smoke.yaml").read_text()
    (tmp_path / "params" / "smoke.yaml").write_text(source)
    _export(tmp_path, [_trial(0, 0.8, 2, 2, "off"), _trial(3, 0.6, 2, 4, 0.7)])
    promote.main(["--study", "s1", "--preset", "smoke"])
    text = (tmp_path / "params" / "smoke.yaml").read_text()
    data = yaml.safe_load(text)
    # the first grid takes the chosen values; the lossless W = 1 grid after it stays
    assert data["bench"]["sweep"]["setdlm"] == [
        {"threshold": ["off", 0.7], "window": [2, 4]},
        {"window": [1]},
    ]
    assert data["bench"]["sweep"]["bd3lm"] == yaml.safe_load(source)["bench"]["sweep"]["bd3lm"]
    assert data["decode"]["setdlm"] == {"window": 2, "threshold": "off"}  # the most accurate
    assert data["paradigm"]["setdlm"]["set_size"] == 2
    assert text.splitlines()[:2] == source.splitlines()[:2]  # the header comment survives
    (tmp_path / "ablations" / "arith" / "s1" / "study.json").unlink()
    (tmp_path / "ablations" / "arith" / "s1").rmdir()
    _export(tmp_path, [_trial(0, 0.8, 2, 2, "off"), _trial(1, 0.7, 4, 4, "off")])
    with pytest.raises(ConfigError, match="trained different models.*--trials"):
        promote.main(["--study", "s1", "--preset", "smoke"])
    promote.main(["--study", "s1", "--preset", "smoke", "--trials", "1"])
    promoted = yaml.safe_load((tmp_path / "params" / "smoke.yaml").read_text())
    assert promoted["paradigm"]["setdlm"]["set_size"] == 4
    with pytest.raises(ConfigError, match="studies found: \\['s1'\\]"):
        promote.main(["--study", "nope", "--preset", "smoke"])


# --------------------------------------------------------------------------------------------
# The real trial on a tiny task (prepare -> tokenize -> train ar, in-process)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from setdiff.stages import prepare, tokenize
    from setdiff.stages import train as train_stage

    root = tmp_path_factory.mktemp("repo")
    data = dict(preset())
    data["data"]["arith"].update(n_train=96, n_valid=8, n_test=4)
    fast = {"steps": 4, "batch_size": 8, "eval_every": 2, "eval_examples": 8, "warmup_steps": 1}
    for recipe in ("ar", "diffusion"):
        data["train"]["arith"][recipe].update(fast)
    data["bench"]["run"].update(warmup=0)
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    common = ["--task", "arith", "--params", str(params), "--root", str(root)]
    prepare.main(common)
    tokenize.main(common)
    train_stage.main([*common, "--paradigm", "ar"])
    return root, params


def _run_trial(repo: tuple[Path, Path], name: str, prune: dict | None) -> dict[str, Any]:
    root, params = repo
    spec = {
        "study": "s",
        "number": 0,
        "knobs": {"set_size": 2, "window": "2D", "threshold": 0.7},
        "trains": True,
        "budget": {"train_steps": 4, "eval_every": 2, "n_examples": 2},
        "prune": prune,
        "constraints": {"accuracy": {"min": 0.5, "max": None}},
    }
    (root / f"{name}.json").write_text(json.dumps(spec))
    argv = ["--task", "arith", "--params", str(params), "--root", str(root), "--cache"]
    out = root / "trials" / name
    trial.main(
        [*argv, str(root / "cache"), "--spec", str(root / f"{name}.json"), "--out", str(out)]
    )
    return json.loads((out / "result.json").read_text())


def test_trial_trains_decodes_caches_and_prunes(tiny_repo: tuple[Path, Path]) -> None:
    first = _run_trial(tiny_repo, "first", None)
    assert first["n"] == 2 and not first["pruned"] and first["train"]["cached"] is False
    assert [step for step, _ in first["train"]["curve"]] == [2, 4]
    assert first["decode_options"] == {"window": 4, "threshold": 0.7}
    assert first["constraints"] == {"accuracy_min": 0.5 - first["accuracy"]}
    again = _run_trial(tiny_repo, "again", None)  # same training knobs: the cached model
    assert again["train"]["cached"] is True
    assert {k: again[k] for k in ("accuracy", "nfe_mean")} == {
        k: first[k] for k in ("accuracy", "nfe_mean")
    }
    peers = [{"knobs": {}, "curve": [[2, 0.0]]}, {"knobs": {}, "curve": [[2, 0.1]]}]
    rule = {"peers": peers, "min_trials": 2, "warmup_steps": 0, "group_by": []}
    shutil.rmtree(tiny_repo[0] / "cache")
    pruned = _run_trial(tiny_repo, "pruned", rule)
    assert pruned["pruned"] and pruned["pruned_at"] == 2 and "accuracy" not in pruned
    assert not list((tiny_repo[0] / "cache").glob("*/model.safetensors"))


def test_a_cached_trial_model_is_not_reused_once_its_start_weights_change(
    tiny_repo: tuple[Path, Path],
) -> None:
    """The cache key covers the starting weights' bytes, not only their path."""
    from safetensors.torch import load_file, save_file

    weights_file = tiny_repo[0] / "models/arith/ar/model.safetensors"
    original = weights_file.read_bytes()
    _run_trial(tiny_repo, "start", None)
    assert _run_trial(tiny_repo, "same", None)["train"]["cached"] is True
    weights = load_file(str(weights_file))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(weights_file))
    try:
        assert _run_trial(tiny_repo, "other-ar", None)["train"]["cached"] is False
    finally:
        weights_file.write_bytes(original)
    assert _run_trial(tiny_repo, "ar-again", None)["train"]["cached"] is True
