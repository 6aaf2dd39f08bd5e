"""The seed-variance stage on tiny data: one cell per (paradigm, seed), finished cells kept."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from metrics_records import evaluate_metrics
from safetensors.torch import load_file
from tiny_run import tiny_params

from setdiff import retrain
from setdiff.artifacts import load_model
from setdiff.config import ConfigError
from setdiff.preset import load_preset
from setdiff.recipe import TaskTrainConfig
from setdiff.stages import prepare, seeds, tokenize
from setdiff.stages import train as train_stage
from setdiff.stages.common import Layout

PARAMS: dict[str, Any] = tiny_params(
    seeds={"paradigms": ["setdlm"], "seeds": [1, 2], "n_examples": 4}
)


def _run(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The seeds stage (data and the AR model made first, once, as the pipeline does)."""
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    args = ["--params", str(path), "--task", "arith", "--root", str(root)]
    if not (root / "models" / "arith" / "ar").exists():
        prepare.main(args)
        tokenize.main(args)
        train_stage.main([*args, "--paradigm", "ar"])
    seeds.main(args)
    return json.loads((root / "metrics" / "seeds" / "arith.json").read_text())


def _copy(params: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(params))


def test_two_seeds_their_summary_and_finished_cells_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[int] = []
    original = retrain.train
    weights: list[dict[str, Any]] = []

    def spy(net, paradigm, train_split, valid_split, config):  # type: ignore[no-untyped-def]
        trained.append(config.seed)
        result = original(net, paradigm, train_split, valid_split, config)
        weights.append(result.weights)
        return result

    monkeypatch.setattr(retrain, "train", spy)
    metrics = _run(tmp_path, PARAMS)
    assert trained == [1, 2]
    cells = tmp_path / "results" / "seeds" / "arith"
    assert sorted(p.name for p in cells.iterdir()) == ["setdlm-1.json", "setdlm-2.json"]
    row = json.loads((cells / "setdlm-2.json").read_text())["row"]
    assert row["seed"] == 2 and row["n_examples"] == 4 and row["steps"] == 3

    summary = metrics["paradigms"]["setdlm"]
    assert summary["seeds"] == [1, 2] and summary["n"] == 2 and metrics["n_examples"] == 4
    accuracies = summary["accuracies"]
    assert all(0.0 <= a <= 1.0 for a in accuracies)
    mean = sum(accuracies) / 2
    assert summary["mean"] == pytest.approx(mean)
    assert summary["sd"] == pytest.approx(abs(accuracies[0] - accuracies[1]) / 2**0.5)
    assert summary["binomial_se"] == pytest.approx((mean * (1 - mean) / 4) ** 0.5)
    assert summary["recipe_seed"] == 0 and summary["recipe_steps"] == 3

    # Different seeds: different fine-tuned weights from the same AR model.
    ar = load_file(str(tmp_path / "models" / "arith" / "ar" / "model.safetensors"))
    name = next(k for k in weights[0] if weights[0][k].is_floating_point())
    assert not weights[0][name].equal(weights[1][name])
    assert not weights[0][name].equal(ar[name])

    # A re-run trains nothing; a changed config retrains every cell it changes, only those.
    trained.clear()
    assert _run(tmp_path, PARAMS) == metrics
    assert trained == []
    more = _copy(PARAMS)
    more["seeds"]["seeds"] = [1, 2, 3]
    assert _run(tmp_path, more)["paradigms"]["setdlm"]["seeds"] == [1, 2, 3]
    assert trained == [3]
    trained.clear()
    longer = _copy(more)
    longer["seeds"]["steps"] = 2
    assert _run(tmp_path, longer)["paradigms"]["setdlm"]["steps"] == 2
    assert trained == [1, 2, 3]


def test_each_seed_trains_its_own_ar_and_its_fine_tunes_start_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``ar`` listed, a seed's AR model is trained, kept, and is where that seed's
    fine-tunes start; the extra decode is scored on the same model."""
    starts: list[tuple[str, Any]] = []
    original = retrain.initial_weights

    def spy(net_config, seed, init, task, tokenizer=None, *, paradigm="ar"):  # type: ignore[no-untyped-def]
        starts.append((seed, None if init is None else Path(init).name))
        return original(net_config, seed, init, task, tokenizer, paradigm=paradigm)

    monkeypatch.setattr(retrain, "initial_weights", spy)
    params = _copy(PARAMS)
    params["train"]["arith"]["init_from_ar"] = True
    params["seeds"].update(
        paradigms=["setdlm", "ar"], also_decode={"setdlm": {"window": 1}}, threads=1
    )
    metrics = _run(tmp_path, params)
    models = tmp_path / "results" / "seeds" / "arith" / "models"
    assert starts == [(1, None), (1, "ar-1"), (2, None), (2, "ar-2")]
    assert sorted(p.name for p in models.iterdir()) == ["ar-1", "ar-2"]
    assert metrics["ar_per_seed"] is True and metrics["threads"] == 1
    ar_1 = load_file(str(models / "ar-1" / "model.safetensors"))
    ar_2 = load_file(str(models / "ar-2" / "model.safetensors"))
    name = next(k for k in ar_1 if ar_1[k].is_floating_point())
    assert not ar_1[name].equal(ar_2[name])
    setdlm = metrics["paradigms"]["setdlm"]
    assert setdlm["also"]["decode"]["window"] == 1 and setdlm["also"]["n"] == 2
    assert all(t >= 1.0 for t in setdlm["tokens_per_forward"])
    assert all(t == pytest.approx(1.0) for t in metrics["paradigms"]["ar"]["tokens_per_forward"])
    assert setdlm["min"] <= setdlm["mean"] <= setdlm["max"]

    # A seed's AR model deleted: that AR cell is retrained (same weights on one machine), so its
    # fine-tunes keep their rows; a re-run with everything in place trains nothing.
    starts.clear()
    import shutil

    shutil.rmtree(models / "ar-2")
    again = _run(tmp_path, params)
    assert again["paradigms"] == metrics["paradigms"]  # only the retrained cell's seconds moved
    assert starts == [(2, None)]


def test_the_recipes_own_seed_is_the_main_runs_model_scored_not_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 0 is the recipe's: its AR and fine-tune are the train stage's models (trained with
    that config: retraining it here gives the same weights), scored like any other cell; only
    seed 1 is trained. A changed main-run model is scored again."""
    trained: list[tuple[str, int]] = []
    original = retrain.train

    def spy(net, paradigm, train_split, valid_split, config):  # type: ignore[no-untyped-def]
        trained.append((paradigm.config.name, config.seed))
        return original(net, paradigm, train_split, valid_split, config)

    params = _copy(PARAMS)
    params["train"]["arith"]["init_from_ar"] = True
    params["seeds"].update(paradigms=["ar", "setdlm"], seeds=[0, 1], threads=1)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    args = ["--params", str(path), "--task", "arith", "--root", str(tmp_path)]
    prepare.main(args)
    tokenize.main(args)
    train_stage.main([*args, "--paradigm", "ar"])
    monkeypatch.setattr(retrain, "train", spy)
    missing = r"models/arith/setdlm has no trained model.*train stage"
    with pytest.raises(ConfigError, match=missing):
        seeds.main(args)  # before any compute: nothing trained
    assert trained == [] and not (tmp_path / "results").exists()
    train_stage.main([*args, "--paradigm", "setdlm"])
    metrics = _run(tmp_path, params)
    assert trained == [("ar", 1), ("setdlm", 1)]
    cells = tmp_path / "results" / "seeds" / "arith"
    assert sorted(p.name for p in (cells / "models").iterdir()) == ["ar-1"]
    for name in ("ar", "setdlm"):
        summary = metrics["paradigms"][name]
        assert summary["seeds"] == [0, 1] and summary["from_main_run"] == [0]
        row = json.loads((cells / f"{name}-0.json").read_text())["row"]
        main = tmp_path / "models" / "arith" / name
        scored = retrain.score(load_model(main), retrain_data(tmp_path), params["decode"][name])
        assert (row["accuracy"], row["tokens_per_forward"]) == (
            scored["accuracy"],
            scored["tokens_per_forward"],
        )
        assert row["model"] == "main run" and row["steps"] == 3 and row["seed"] == 0

    # The premise: the seed-0 cell trained here (1 thread) is the main run's model, bit for bit.
    preset = load_preset(path)
    recipe = preset.section("train.arith", TaskTrainConfig)
    again = retrain.make_cell(
        preset,
        recipe,
        "setdlm",
        name="x",
        where="test",
        train={"seed": 0, "threads": 1},
        source=tmp_path / "models" / "arith" / "ar",
    )
    keep = tmp_path / "again"
    retrain.run(dataclasses.replace(again, keep=keep), retrain_data(tmp_path))
    mine = load_file(str(keep / "model.safetensors"))
    main = load_file(str(tmp_path / "models" / "arith" / "setdlm" / "model.safetensors"))
    assert mine.keys() == main.keys() and all(mine[k].equal(main[k]) for k in main)

    # A re-run trains and scores nothing; a retrained main-run model is scored again.
    trained.clear()
    assert _run(tmp_path, params)["paradigms"] == metrics["paradigms"]
    assert trained == []
    row_file = cells / "setdlm-0.json"
    before = row_file.stat().st_mtime_ns
    params["train"]["arith"]["diffusion"]["lr"] = 0.0123
    path.write_text(yaml.safe_dump(params))
    train_stage.main([*args, "--paradigm", "setdlm"])
    _run(tmp_path, params)
    assert row_file.stat().st_mtime_ns != before
    assert trained == [("setdlm", 1)]  # seed 1 follows the new recipe; seed 0 is the run's


def retrain_data(root: Path) -> retrain.Data:
    """What the seeds stage's cells read, for scoring a model as they are scored."""
    preset = load_preset(root / "params.yaml")
    recipe = preset.section("train.arith", TaskTrainConfig)
    data = retrain.load_data(preset, Layout(str(root), "arith", ""), recipe, 4)
    return dataclasses.replace(data, source=None)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p["seeds"].update(paradigms=["gpt"]), r"seeds.*paradigms.*not paradigms"),
        (lambda p: p["seeds"].update(also_decode={"mdlm": {}}), r"seeds.*also_decode.*mdlm"),
        (
            lambda p: p["seeds"].update(also_decode={"setdlm": {"windw": 1}}),
            r"also_decode\.setdlm.*windw",
        ),
        (lambda p: p["seeds"].update(seeds=[]), r"seeds.*seeds must not be empty"),
        (lambda p: p["seeds"].update(seeds=[1, 1]), r"seeds.*seeds: duplicates"),
        (lambda p: p["seeds"].update(steps=0), r"seeds.*steps must be >= 1"),
        (lambda p: p["seeds"].update(n_examples=0), r"seeds.*n_examples must be >= 1"),
        (lambda p: p["seeds"].update(threads=0), r"seeds.*threads must be >= 1"),
        (lambda p: p["seeds"].update(seed=[1]), r"seeds.*seed"),
        (lambda p: p["decode"].update(setdlm={"windw": 2}), r"decode\.setdlm.*windw"),
    ],
)
def test_bad_params_name_the_key(tmp_path: Path, edit: Any, message: str) -> None:
    bad = _copy(PARAMS)
    edit(bad)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=message) as err:
        seeds.main(["--params", str(path), "--task", "arith", "--root", str(tmp_path)])
    assert "\n" not in str(err.value)


SEEDS_METRICS = {
    "task": "arith",
    "n_examples": 500,
    "steps": None,
    "paradigms": {
        "ar": {
            "seeds": [1, 2],
            "accuracies": [0.69, 0.7],
            "n": 2,
            "mean": 0.695,
            "sd": 0.007071,
            "binomial_se": 0.020594,
            "tokens_per_forward": [1.0, 1.0],
            "steps": 3000,
            "recipe_seed": 0,
            "recipe_steps": 3000,
        },
        "setdlm": {
            "seeds": [1, 2],
            "accuracies": [0.7, 0.66],
            "also": {
                "decode": {"verify": True, "window": 8},
                "accuracies": [0.72, 0.71],
                "mean": 0.715,
                "sd": 0.007071,
                "binomial_se": 0.02,
                "tokens_per_forward": [3.5, 3.3],
            },
            "tokens_per_forward": [0.98, 0.96],
            "n": 2,
            "mean": 0.68,
            "sd": 0.028284,
            "binomial_se": 0.020861,
            "steps": 1600,
            "recipe_seed": 0,
            "recipe_steps": 1600,
        },
        "bd3lm": {
            "seeds": [1],
            "accuracies": [0.45],
            "n": 1,
            "mean": 0.45,
            "sd": None,
            "binomial_se": 0.022249,
            "steps": 300,
            "recipe_seed": 0,
            "recipe_steps": 600,
        },
    },
}


def test_the_report_table_renders_from_a_metrics_file(tmp_path: Path) -> None:
    """reports/ reads the stage's file: one row per paradigm, the main run's accuracy joined
    only where the study trained with the recipe's steps; a run without it says how to get it."""
    from reports.inputs.run import load_run
    from reports.render import tables

    empty = load_run(tmp_path)
    assert empty.seeds.empty
    assert [m.problem for m in empty.missing if m.kind == "seeds"] == [
        "not run (study.seeds empty; see params/seeds.yaml)"
    ]
    for paradigm, accuracy in (("setdlm", 0.684), ("bd3lm", 0.5)):
        path = tmp_path / "metrics" / "evaluate" / "arith" / f"{paradigm}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(evaluate_metrics("arith", paradigm, accuracy)))
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"study": {"tasks": ["arith"], "paradigms": ["ar", "bd3lm", "setdlm"]}})
    )
    (tmp_path / "metrics" / "seeds").mkdir(parents=True)
    (tmp_path / "metrics" / "seeds" / "arith.json").write_text(json.dumps(SEEDS_METRICS))
    run = load_run(tmp_path)
    table = tables.seeds_table(run.seeds, run.evaluate).set_index("paradigm")
    assert list(table.index) == ["ar", "bd3lm", "setdlm", "setdlm verify W8"]  # canonical order
    assert table.loc["setdlm", "accuracy per seed"] == "0.700, 0.660"
    assert table.loc["setdlm", "seeds"] == "1, 2"
    marked = json.loads(json.dumps(SEEDS_METRICS))
    marked["paradigms"]["setdlm"]["from_main_run"] = [1]  # as if seed 1 were the recipe's
    (tmp_path / "metrics" / "seeds" / "arith.json").write_text(json.dumps(marked))
    again = tables.seeds_table(load_run(tmp_path).seeds, run.evaluate).set_index("paradigm")
    assert again.loc["setdlm", "seeds"] == "1 (main run), 2"
    assert again.loc["ar", "seeds"] == "1, 2"
    assert table.loc["setdlm", "mean ± sd"] == "0.680 ± 0.028"
    assert table.loc["setdlm", "min–max"] == "0.660–0.700"
    assert table.loc["setdlm", "tokens/forward"] == "0.97"
    # each seed against the same seed's AR model: the sign differs between seeds
    assert table.loc["setdlm", "− AR per seed"] == "+0.010, -0.040"
    assert table.loc["setdlm", "sign on every seed"] == "mixed"
    assert table.loc["setdlm", "worst − AR"] == "-0.040"
    assert table.loc["setdlm verify W8", "− AR per seed"] == "+0.030, +0.010"
    assert table.loc["setdlm verify W8", "sign on every seed"] == "above AR"
    assert table.loc["setdlm verify W8", "tokens/forward"] == "3.40"
    assert table.loc["setdlm verify W8", "main run"] == ""  # another decode than evaluate's
    assert table.loc["ar", "− AR per seed"] == ""
    assert table.loc["setdlm", "sd > 0.03"] == "no"
    # two seeds: sd * sqrt(1 / q) at chi-square(1)'s quantiles q, each a squared normal quantile
    sd, z = statistics.stdev([0.70, 0.66]), statistics.NormalDist().inv_cdf
    assert table.loc["setdlm", "sd 95% CI"] == f"[{sd / z(0.9875):.3f}, {sd / z(0.5125):.3f}]"
    assert table.loc["bd3lm", "sd 95% CI"] == ""  # one seed
    assert table.loc["bd3lm", "− AR per seed"] == "-0.240"  # seed 1 only
    assert table.loc["bd3lm", "sign on every seed"] == "below AR"
    assert table.loc["setdlm", "one-run SE"] == "0.021"
    assert table.loc["setdlm", "main run"] == "0.684 (seed 0)"
    assert table.loc["bd3lm", "mean ± sd"] == "0.450"  # one seed: no sd
    assert table.loc["bd3lm", "main run"] == ""  # other steps than the main run's
    # the main run's model trained other steps than the study (metrics/train): not joined
    train = pd.DataFrame([{"task": "arith", "paradigm": "setdlm", "steps": 4000}])
    longer = tables.seeds_table(run.seeds, run.evaluate, train).set_index("paradigm")
    assert longer.loc["setdlm", "main run"] == ""
    same = train.assign(steps=1600)  # SEEDS_METRICS' setdlm steps
    assert (
        tables.seeds_table(run.seeds, run.evaluate, same)
        .set_index("paradigm")
        .loc["setdlm", "main run"]
        == "0.684 (seed 0)"
    )
    assert table.loc["bd3lm", "seeds"] == "1"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p["study"].update(seeds=["text"]), r"study.*seeds.*\['text'\].*answers"),
        (lambda p: p["study"].update(seeds=["arith"]), r"missing key 'seeds' under <top>"),
        (
            lambda p: (
                p.update(seeds={"paradigms": ["aogpt"]})
                or p["study"].update(paradigms=["ar", "setdlm"], diffusion=["setdlm"])
                or [p["bench"]["sweep"].pop(name) for name in ("mdlm", "bd3lm", "aogpt")]
            ),  # (the bench sweep follows the study: the one error is the one tested)
            r"seeds\.paradigms: \['aogpt'\] not in study\.paradigms",
        ),
    ],
)
def test_preset_validation_checks_the_seed_study(tmp_path: Path, edit: Any, message: str) -> None:
    from setdiff.params import load_params
    from setdiff.validate import validate

    params = yaml.safe_load((Path(__file__).parents[1] / "params" / "smoke.yaml").read_text())
    edit(params)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=message):
        validate(load_params(path))


def test_seeds_preset_is_the_default_study_plus_the_seeds_section() -> None:
    """params/seeds.yaml differs from params/default.yaml only in its name, `study.seeds` and the
    `seeds` section, so its seed-0 models are the default run's."""
    params = Path(__file__).resolve().parents[1] / "params"
    default = yaml.safe_load((params / "default.yaml").read_text())
    seeded = yaml.safe_load((params / "seeds.yaml").read_text())
    section = seeded.pop("seeds")
    assert seeded.pop("preset") == "seeds" and default.pop("preset") == "default"
    assert seeded["study"].pop("seeds") == ["arith"] and default["study"].pop("seeds") == []
    default.pop("seeds", None)
    assert seeded == default
    assert "ar" in section["paradigms"]
