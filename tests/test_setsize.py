"""The set-size stage on tiny data: one model per (paradigm, D), decoded at W = D, kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from metrics_records import evaluate_metrics, train_metrics
from tiny_run import tiny_params

from setdiff import retrain
from setdiff.config import ConfigError
from setdiff.stages import prepare, setsize, tokenize
from setdiff.stages import train as train_stage

PARAMS: dict[str, Any] = tiny_params(
    paradigm={"ar": {}, "setdlm": {"set_size": 2}, "bd3lm": {"block_size": 2}},
    decode={"ar": {}, "setdlm": {"window": 2}, "bd3lm": {}},
    setsize={"paradigms": ["setdlm", "bd3lm"], "set_sizes": [1, 3], "n_examples": 4},
)


def _run(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The setsize stage (data and the AR model made first, once, as the pipeline does)."""
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    args = ["--params", str(path), "--task", "arith", "--root", str(root)]
    if not (root / "models" / "arith" / "ar").exists():
        prepare.main(args)
        tokenize.main(args)
        for paradigm in ("ar", "setdlm"):  # the main run's setdlm: decoded at W = D, or continued
            train_stage.main([*args, "--paradigm", paradigm])
    setsize.main(args)
    return json.loads((root / "metrics" / "setsize" / "arith.json").read_text())


def _copy(params: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(params))


def test_each_set_size_is_trained_and_decoded_at_its_own_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[tuple[str, int]] = []
    decoded: list[dict[str, Any]] = []
    original_train, original_rows = retrain.train, retrain.answer_rows

    def spy_train(net, paradigm, train_split, valid_split, config):  # type: ignore[no-untyped-def]
        size = getattr(paradigm.config, "set_size", None) or paradigm.config.block_size
        trained.append((type(paradigm).__name__.lower(), size))
        assert config.seed == 0 and config.batch_size == 8  # the recipe, only D replaced
        return original_train(net, paradigm, train_split, valid_split, config)

    def spy_rows(model, records, **kw):  # type: ignore[no-untyped-def]
        decoded.append(kw["decode_options"])
        return original_rows(model, records, **kw)

    monkeypatch.setattr(retrain, "train", spy_train)
    monkeypatch.setattr(retrain, "answer_rows", spy_rows)
    metrics = _run(tmp_path, PARAMS)
    assert trained == [("setdlm", 1), ("setdlm", 3), ("bd3lm", 1), ("bd3lm", 3)]
    # setdlm at W = D, then the main run's model (D = 2) decoded at that W without training.
    assert decoded == [{"window": 1}] * 2 + [{"window": 3}] * 2 + [{}, {}]
    cells = tmp_path / "results" / "setsize" / "arith"
    assert sorted(p.name for p in cells.iterdir()) == [
        "bd3lm-d1.json",
        "bd3lm-d3.json",
        "setdlm-d1-main.json",
        "setdlm-d1.json",
        "setdlm-d3-main.json",
        "setdlm-d3.json",
    ]
    rows = metrics["rows"]
    assert [(r["paradigm"], r["set_size"], r["window"], r["model"]) for r in rows] == [
        ("setdlm", 1, 1, "fine-tuned from AR"),
        ("setdlm", 2, 1, "main run's model, decoded only"),
        ("setdlm", 3, 3, "fine-tuned from AR"),
        ("setdlm", 2, 3, "main run's model, decoded only"),
        ("bd3lm", 1, None, "fine-tuned from AR"),
        ("bd3lm", 3, None, "fine-tuned from AR"),
    ]
    assert metrics["n_examples"] == 4
    assert metrics["main"] == {
        "setdlm": {"set_size": 2, "window": 2},
        "bd3lm": {"set_size": 2, "window": None},
    }
    assert all(r["n_examples"] == 4 and 0 <= r["accuracy"] <= 1 for r in rows)

    # A re-run trains nothing; other steps retrain every cell.
    trained.clear()
    assert _run(tmp_path, PARAMS) == metrics
    assert trained == []
    longer = _copy(PARAMS)
    longer["setsize"]["steps"] = 2
    assert [r.get("steps") for r in _run(tmp_path, longer)["rows"]] == [2, None, 2, None, 2, 2]
    assert len(trained) == 4


def test_start_main_continues_the_main_runs_model_at_the_new_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start: main``: each fine-tune starts from models/<task>/<p> (refused as an AR model),
    with the study's lr; its result differs from a fine-tune from AR."""
    starts: list[tuple[str, str]] = []
    lrs: list[float] = []
    original_init, original_train = retrain.initial_weights, retrain.train

    def spy_init(config, seed, init, task, tokenizer=None, *, paradigm="ar"):  # type: ignore[no-untyped-def]
        starts.append((Path(init).name, paradigm))
        return original_init(config, seed, init, task, tokenizer, paradigm=paradigm)

    def spy_train(net, paradigm, train_split, valid_split, config):  # type: ignore[no-untyped-def]
        lrs.append(config.lr)
        return original_train(net, paradigm, train_split, valid_split, config)

    monkeypatch.setattr(retrain, "initial_weights", spy_init)
    monkeypatch.setattr(retrain, "train", spy_train)
    params = _copy(PARAMS)
    params["setsize"] = {"paradigms": ["setdlm"], "set_sizes": [1], "n_examples": 4}
    from_ar = _run(tmp_path, params)["rows"][0]
    params["setsize"].update(start="main", lr=0.001, decode_main=False)
    from_main = _run(tmp_path, params)
    assert starts == [("ar", "ar"), ("setdlm", "setdlm")]
    assert lrs == [0.003, 0.001]
    assert from_main["start"] == "main" and len(from_main["rows"]) == 1
    row = from_main["rows"][0]
    assert row["model"] == "main run's model, fine-tuned on" and row["set_size"] == 1
    assert row["final_eval_loss"] != from_ar["final_eval_loss"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p["setsize"].update(paradigms=["mdlm"]), r"setsize.*paradigms.*no set size"),
        (lambda p: p["setsize"].update(set_sizes=[]), r"setsize.*set_sizes must not be empty"),
        (lambda p: p["setsize"].update(set_sizes=[0]), r"setsize.*set_sizes must be >= 1"),
        (lambda p: p["setsize"].update(set_sizes=[2, 2]), r"setsize.*set_sizes: duplicates"),
        (lambda p: p["setsize"].update(steps=0), r"setsize.*steps must be >= 1"),
        (lambda p: p["setsize"].update(start="bd3lm"), r"setsize.*start"),
        (lambda p: p["setsize"].update(lr=0), r"setsize.*lr must be > 0"),
        (lambda p: p["setsize"].update(sizes=[1]), r"setsize.*sizes"),
        (lambda p: p["decode"].update(setdlm={"windw": 2}), r"setsize.*decode\.setdlm.*windw"),
    ],
)
def test_bad_params_name_the_key(tmp_path: Path, edit: Any, message: str) -> None:
    bad = _copy(PARAMS)
    edit(bad)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=message) as err:
        setsize.main(["--params", str(path), "--task", "arith", "--root", str(tmp_path)])
    assert "\n" not in str(err.value)


SETSIZE_METRICS = {
    "task": "arith",
    "n_examples": 500,
    "start": "main",
    "main": {"setdlm": {"set_size": 4, "window": 4}, "bd3lm": {"set_size": 4, "window": None}},
    "rows": [
        {"paradigm": "setdlm", "set_size": 2, "window": 2, "accuracy": 0.94, "n_examples": 500,
         "steps": 300, "seed": 0, "model": "main run's model, fine-tuned on"},
        {"paradigm": "setdlm", "set_size": 4, "window": 2, "accuracy": 0.93, "n_examples": 500,
         "model": "main run's model, decoded only"},
        {"paradigm": "bd3lm", "set_size": 2, "window": None, "accuracy": 0.9, "n_examples": 500,
         "steps": 300, "seed": 0, "model": "main run's model, fine-tuned on"},
    ],
}  # fmt: skip


def test_the_report_table_joins_the_main_runs_set_size(tmp_path: Path) -> None:
    """One row per (paradigm, D, W), the main run's own D and W joined from the evaluate stage,
    gaps to the main run's AR; a run without the study says how to get it."""
    from reports.inputs.run import load_run
    from reports.render import tables

    empty = load_run(tmp_path)
    assert empty.setsize.empty
    assert [m.problem for m in empty.missing if m.kind == "setsize"] == [
        "not run (study.setsize empty)"
    ]
    for paradigm, accuracy in (("ar", 0.95), ("setdlm", 0.9), ("bd3lm", 0.85)):
        path = tmp_path / "metrics" / "evaluate" / "arith" / f"{paradigm}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(evaluate_metrics("arith", paradigm, accuracy)))
    train = tmp_path / "metrics" / "train" / "arith" / "setdlm.json"
    train.parent.mkdir(parents=True)
    train.write_text(json.dumps(train_metrics("arith", "setdlm", 2000)))
    params = {
        "study": {"tasks": ["arith"], "paradigms": ["ar", "bd3lm", "setdlm"], "setsize": ["arith"]},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "metrics" / "setsize").mkdir(parents=True)
    (tmp_path / "metrics" / "setsize" / "arith.json").write_text(json.dumps(SETSIZE_METRICS))
    run = load_run(tmp_path)
    table = tables.setsize_table(run.setsize, run.evaluate, run.train)
    columns = ["paradigm", "D (trained)", "W", "accuracy", "gap to AR (pts)", "steps", "model"]
    assert table[columns].values.tolist() == [
        [
            "bd3lm",
            "2",
            "",
            "0.900 [0.871, 0.923]",
            "-5.0",
            "300",
            "main run's model, fine-tuned on",
        ],
        ["bd3lm", "4", "", "0.850 [0.816, 0.879]", "-10.0", "", "main run"],
        [
            "setdlm",
            "2",
            "2",
            "0.940 [0.916, 0.958]",
            "-1.0",
            "300",
            "main run's model, fine-tuned on",
        ],
        ["setdlm", "4", "2", "0.930 [0.904, 0.949]", "-2.0", "", "main run's model, decoded only"],
        ["setdlm", "4", "4", "0.900 [0.871, 0.923]", "-5.0", "2000", "main run"],
    ]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p["study"].update(setsize=["text"]), r"study.*setsize.*\['text'\].*answers"),
        (lambda p: p["study"].update(setsize=["arith"]), r"missing key 'setsize' under <top>"),
        (
            lambda p: (
                p.update(setsize={"paradigms": ["bd3lm"]})
                or p["study"].update(paradigms=["ar", "setdlm"], diffusion=["setdlm"])
                or [p["bench"]["sweep"].pop(name) for name in ("mdlm", "bd3lm", "aogpt")]
            ),  # (the bench sweep follows the study: the one error is the one tested)
            r"setsize\.paradigms: \['bd3lm'\] not in study\.paradigms",
        ),
    ],
)
def test_preset_validation_checks_the_set_size_study(
    tmp_path: Path, edit: Any, message: str
) -> None:
    from setdiff.params import load_params
    from setdiff.validate import validate

    params = yaml.safe_load((Path(__file__).parents[1] / "params" / "smoke.yaml").read_text())
    edit(params)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=message):
        validate(load_params(path))
