"""The train stage and its accuracy curves (each evaluation's weights kept by training, decoded
on validation prompts by the curve stage), and per-paradigm budgets."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from test_train import copy_task, fresh

from setdiff.config import ConfigError
from setdiff.paradigm import make_paradigm
from setdiff.recipe import TaskTrainConfig
from setdiff.stages import curve as curve_stage
from setdiff.stages import prepare, tokenize
from setdiff.stages import train as train_stage
from setdiff.train import TrainConfig, train

RECIPE = {"steps": 4, "batch_size": 8, "warmup_steps": 1, "eval_every": 2, "eval_examples": 8}
PARAMS: dict[str, Any] = {
    "data": {"seed": 0, "arith": {"n_train": 40, "n_valid": 10, "n_test": 10}},
    "tokenizer": {"arith": {"kind": "char", "seq_len": 32}},
    "model": {"arith": {"n_layer": 1, "n_head": 2, "n_kv_head": 2, "d_model": 32, "d_ff": 64}},
    "paradigm": {"ar": {}, "aogpt": {}},
    "train": {
        "arith": {
            "ar": RECIPE,
            "diffusion": dict(RECIPE),
            "curve": {"n_examples": 3, "decode": {"aogpt": {"order": "confidence", "window": 2}}},
        }
    },
}


def _stage(root: Path, params: dict[str, Any], paradigm: str) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(root / "params.yaml"), "--task", "arith", "--root", str(root)]
    if not (root / "data" / "arith" / "encoded").exists():
        prepare.main(args)
        tokenize.main(args)
    train_stage.main([*args, "--paradigm", paradigm])
    log = root / "models" / "arith" / paradigm / "train_log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def _curve(root: Path, params: dict[str, Any], paradigm: str) -> dict[str, Any]:
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(root / "params.yaml"), "--task", "arith", "--root", str(root)]
    curve_stage.main([*args, "--paradigm", paradigm])
    return json.loads((root / "metrics" / "curve" / "arith" / f"{paradigm}.json").read_text())


def test_every_evaluation_is_kept_and_decoded_by_the_curve_stage_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, dict[str, Any]]] = []
    original = curve_stage.answer_rows

    def spy(model: Any, records: Any, **kw: Any) -> Any:
        records = list(records)
        seen.append((len(records), dict(kw["decode_options"])))
        return original(model, records, **kw)

    monkeypatch.setattr(curve_stage, "answer_rows", spy)
    log = _stage(tmp_path, PARAMS, "ar")
    assert [r["step"] for r in log] == [2, 4]
    assert all("accuracy" not in r for r in log)  # training decodes nothing
    snapshots = tmp_path / "snapshots" / "arith" / "ar"
    assert json.loads((snapshots / "steps.json").read_text()) == [2, 4]
    curve = _curve(tmp_path, PARAMS, "ar")
    assert [p["step"] for p in curve["points"]] == [2, 4] and curve["n_examples"] == 3
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in curve["points"])
    assert seen == [(3, {}), (3, {})]  # ar: its defaults
    seen.clear()
    _stage(tmp_path, PARAMS, "aogpt")
    _curve(tmp_path, PARAMS, "aogpt")
    assert seen == [(3, {"order": "confidence", "window": 2})] * 2


def test_the_last_snapshot_is_the_model_and_its_point_is_the_model_decoded(
    tmp_path: Path,
) -> None:
    """The snapshots are the weights training evaluated: the last one is the exported model's,
    so its curve point is the exported model's accuracy on those prompts, decoded as the curve
    decodes them (as the callback that decoded inside training did)."""
    from safetensors.torch import load_file

    from setdiff.artifacts import load_model
    from setdiff.evaluate import SCORING_BATCH, answer_rows
    from setdiff.tasks import read_records

    _stage(tmp_path, PARAMS, "ar")
    last = load_file(str(tmp_path / "snapshots" / "arith" / "ar" / "000004.safetensors"))
    model = load_model(tmp_path / "models" / "arith" / "ar")
    assert all(torch.equal(model.net.state_dict()[k], v) for k, v in last.items())
    records = read_records(tmp_path / "data" / "arith" / "raw" / "valid.jsonl", "arith")[:3]
    rows = answer_rows(
        model, records, task="arith", seq_len=model.net.config.max_seq_len, decode_options={},
        show_progress=False, batch_size=SCORING_BATCH,
    )  # fmt: skip
    expected = sum(r["exact"] for r in rows) / len(rows)
    assert _curve(tmp_path, PARAMS, "ar")["points"][-1] == {"step": 4, "accuracy": expected}


def test_without_a_curve_nothing_is_kept_and_the_curve_is_empty(tmp_path: Path) -> None:
    params = json.loads(json.dumps(PARAMS))
    del params["train"]["arith"]["curve"]
    assert all("accuracy" not in r for r in _stage(tmp_path, params, "ar"))
    snapshots = tmp_path / "snapshots" / "arith" / "ar"
    assert sorted(p.name for p in snapshots.iterdir()) == ["steps.json"]
    assert _curve(tmp_path, params, "ar")["points"] == []


@pytest.mark.parametrize(
    ("curve", "match"),
    [
        (
            {"n_examples": 2, "decode": {"aogpt": {"ordre": "random"}}},
            r"curve\.decode\.aogpt.*ordre",
        ),
        ({"n_examples": 2, "decode": {"gpt": {}}}, r"unknown paradigm.*gpt"),
        ({"n_examples": -1}, r"n_examples must be >= 0"),
    ],
)
def test_bad_curve_options_are_refused_before_any_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, curve: dict[str, Any], match: str
) -> None:
    params = json.loads(json.dumps(PARAMS))
    params["train"]["arith"]["curve"] = curve
    _stage(tmp_path, PARAMS, "ar")  # the AR model the fine-tune starts from
    _stage(tmp_path, PARAMS, "aogpt")
    monkeypatch.setattr(curve_stage, "answer_rows", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(ConfigError, match=match):
        _curve(tmp_path, params, "aogpt")


def test_the_train_stage_imports_no_sampler() -> None:
    """Training decodes nothing (the curve stage does): a sampler edit retrains no model."""
    code = (
        "import sys; from setdiff.stages import train;"
        "print(sorted(m for m in sys.modules if m.startswith('setdiff.sampling')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).parents[1],
    ).stdout  # fmt: skip
    assert out.strip() == "[]"


def test_what_on_eval_returns_is_logged_even_when_it_raises(tmp_path: Path) -> None:
    split, paradigm = copy_task(), make_paradigm("ar", mask_id=3)
    config = TrainConfig(steps=4, batch_size=8, warmup_steps=1, eval_every=2, eval_examples=8)
    path = tmp_path / "log.jsonl"
    modes: list[bool] = []

    def on_eval(step: int, loss: float) -> dict[str, float]:
        modes.append(net.training)
        if step == 4:
            raise KeyboardInterrupt
        return {"accuracy": 0.5}

    net = fresh()
    with pytest.raises(KeyboardInterrupt):
        train(net, paradigm, split, split, config, log_path=path, on_eval=on_eval,
              show_progress=False)  # fmt: skip
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert records[0]["accuracy"] == 0.5 and "accuracy" not in records[1]
    assert modes == [False, False]  # decoded in eval mode
    assert net.training


def test_the_callback_sees_the_ema_weights_and_training_resumes_on_the_raw_ones() -> None:
    split, paradigm = copy_task(), make_paradigm("ar", mask_id=3)
    config = TrainConfig(
        steps=3, batch_size=8, warmup_steps=1, eval_every=3, eval_examples=8, ema_decay=0.5
    )
    seen: dict[str, torch.Tensor] = {}
    net = fresh()

    def on_eval(step: int, loss: float) -> None:
        seen.update({k: v.clone() for k, v in net.state_dict().items()})

    result = train(net, paradigm, split, split, config, on_eval=on_eval, show_progress=False)
    assert all(torch.equal(seen[k], result.weights[k]) for k in result.weights)  # the EMA
    assert not all(torch.equal(net.state_dict()[k], result.weights[k]) for k in result.weights)


def test_a_paradigm_may_override_the_diffusion_recipe(tmp_path: Path) -> None:
    params = json.loads(json.dumps(PARAMS))
    params["train"]["arith"]["paradigms"] = {"aogpt": {"steps": 6}}
    _stage(tmp_path, params, "ar")
    assert [r["step"] for r in _stage(tmp_path, params, "aogpt")] == [2, 4, 6]
    ar, diffusion = (
        TrainConfig(steps=1, warmup_steps=1),
        TrainConfig(steps=2, warmup_steps=1, lr=0.1),
    )
    recipe = TaskTrainConfig(ar=ar, diffusion=diffusion, paradigms={"setdlm": {"steps": 3}})
    assert recipe.for_paradigm("setdlm") == dataclasses.replace(diffusion, steps=3)
    assert recipe.for_paradigm("mdlm") == diffusion


@pytest.mark.parametrize(
    ("paradigms", "match"),
    [
        ({"ar": {"steps": 3}}, r"paradigms: \['ar'\] are not diffusion paradigms"),
        ({"setdlm": {"stpes": 3}}, r"paradigms\.setdlm.*stpes"),
        ({"setdlm": {"steps": 0}}, r"steps must be >= 1"),
    ],
)
def test_bad_paradigm_overrides_are_refused_naming_the_key(
    tmp_path: Path, paradigms: dict[str, Any], match: str
) -> None:
    params = json.loads(json.dumps(PARAMS))
    params["train"]["arith"]["paradigms"] = paradigms
    with pytest.raises(ConfigError, match=match):
        _stage(tmp_path, params, "ar")


# ---------------------------------------------------------------------------------------------
# Resuming a killed training: only from a checkpoint made from the same inputs

KILLABLE: dict[str, Any] = json.loads(json.dumps(PARAMS))
KILLABLE["train"]["arith"] = {
    recipe: {**RECIPE, "steps": 6, "checkpoint_every": 2} for recipe in ("ar", "diffusion")
}


class Killed(Exception):
    pass


def _killed(root: Path, params: dict[str, Any], paradigm: str, mp: pytest.MonkeyPatch) -> None:
    """Run the stage and kill it at its step-4 evaluation: its step-2 checkpoint is left."""
    real = train_stage.train

    def dies_at_4(*args: Any, **kwargs: Any) -> Any:
        def on_eval(step: int, loss: float) -> None:
            if step == 4:
                raise Killed

        return real(*args, **{**kwargs, "on_eval": on_eval})

    with mp.context() as patch:
        patch.setattr(train_stage, "train", dies_at_4)
        with pytest.raises(Killed):
            _stage(root, params, paradigm)
    assert list((root / "checkpoints" / "arith" / paradigm).glob("*/state.pt"))


def _trained(root: Path, paradigm: str) -> tuple[dict[str, Any], bytes]:
    metrics = json.loads((root / "metrics" / "train" / "arith" / f"{paradigm}.json").read_text())
    return metrics, (root / "models" / "arith" / paradigm / "model.safetensors").read_bytes()


def _tokenize(root: Path, params: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(root / "params.yaml"), "--task", "arith", "--root", str(root)]
    prepare.main(args)
    tokenize.main(args)


def _starting_over(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "starting over" in r.getMessage()]


def test_a_killed_training_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _stage(tmp_path / "full", KILLABLE, "ar")
    _killed(tmp_path / "killed", KILLABLE, "ar", monkeypatch)
    _stage(tmp_path / "killed", KILLABLE, "ar")
    metrics, weights = _trained(tmp_path / "killed", "ar")
    assert metrics["resumed_from"] == 2 and metrics["steps"] == 6
    assert weights == _trained(tmp_path / "full", "ar")[1]
    assert _starting_over(caplog) == []


def test_changed_encoded_data_starts_the_training_over_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _killed(tmp_path, KILLABLE, "ar", monkeypatch)
    (rid,) = [p.name for p in (tmp_path / "checkpoints" / "arith" / "ar").iterdir()]
    other = json.loads(json.dumps(KILLABLE))
    other["data"]["seed"] = 1
    _tokenize(tmp_path, other)
    _stage(tmp_path, other, "ar")
    assert _trained(tmp_path, "ar")[0]["resumed_from"] == 0
    (line,) = _starting_over(caplog)
    assert line.startswith(f"train arith/ar: checkpoint {rid} was made from other inputs (")
    assert "encoded train split" in line and "start weights" not in line
    # ... and ends where an uninterrupted run on the new data does.
    _tokenize(tmp_path / "fresh", other)
    _stage(tmp_path / "fresh", other, "ar")
    assert _trained(tmp_path, "ar")[1] == _trained(tmp_path / "fresh", "ar")[1]


def test_changed_start_weights_at_the_same_path_start_the_fine_tune_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _stage(tmp_path, KILLABLE, "ar")  # models/arith/ar: where aogpt starts from
    _killed(tmp_path, KILLABLE, "aogpt", monkeypatch)
    other = json.loads(json.dumps(KILLABLE))
    other["train"]["arith"]["ar"]["seed"] = 1  # another AR model, at the same path
    before = _trained(tmp_path, "ar")[1]
    _stage(tmp_path, other, "ar")
    assert _trained(tmp_path, "ar")[1] != before
    _stage(tmp_path, other, "aogpt")
    assert _trained(tmp_path, "aogpt")[0]["resumed_from"] == 0
    (line,) = _starting_over(caplog)
    assert line.startswith("train arith/aogpt: checkpoint ") and "(start weights changed)" in line


def test_a_checkpoint_without_a_record_of_its_inputs_is_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint left by a run that did not record its inputs (an older version)."""
    _killed(tmp_path, KILLABLE, "ar", monkeypatch)
    (record,) = (tmp_path / "checkpoints" / "arith" / "ar").glob(f"*/{train_stage.INPUTS_FILE}")
    record.unlink()
    _stage(tmp_path, KILLABLE, "ar")
    assert _trained(tmp_path, "ar")[0]["resumed_from"] == 0
    (line,) = _starting_over(caplog)
    assert "has no record of the inputs it was made from" in line
