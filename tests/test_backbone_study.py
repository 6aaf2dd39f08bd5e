"""The backbone-study stage on tiny data: one row per variant, finished variants kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from setdiff.config import ConfigError
from setdiff.stages import backbone, prepare, tokenize

RECIPE = {"steps": 3, "batch_size": 8, "warmup_steps": 1, "eval_every": 3, "eval_examples": 8}
PARAMS: dict[str, Any] = {
    "data": {"seed": 0, "arith": {"n_train": 40, "n_valid": 10, "n_test": 10}},
    "tokenizer": {"arith": {"kind": "char", "seq_len": 32}},
    "model": {"arith": {"n_layer": 1, "n_head": 2, "n_kv_head": 1, "d_model": 32, "d_ff": 64}},
    "backbone": {
        "variants": {"base": {}, "four-heads": {"n_head": 4, "n_kv_head": 4}},
        "ar": RECIPE,
        "diffusion": dict(RECIPE),
        "set_sizes": [2],
        "n_examples": 3,
    },
}


_NOT_RUN = "not run yet (setdiff backbone computes it)"


def _run(root: Path, params: dict[str, Any], *extra: str) -> dict[str, Any]:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    args = ["--params", str(path), "--task", "arith", "--root", str(root), *extra]
    if not (root / "data" / "arith" / "encoded").exists():
        prepare.main(args[:6])
        tokenize.main(args[:6])
    backbone.main(args)
    return json.loads((root / "metrics" / "backbone" / "arith.json").read_text())


def test_one_row_per_variant_and_finished_variants_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _run(tmp_path, PARAMS)
    rows = {row["variant"]: row for row in table["rows"]}
    assert list(rows) == ["base", "four-heads"]
    assert rows["four-heads"]["model"]["n_head"] == 4 and rows["base"]["model"]["n_head"] == 2
    for row in rows.values():
        for key in ("ar", "setdlm_d2", "setdlm_d2_w1"):
            assert 0.0 <= row[key] <= 1.0
    assert table["n_examples"] == 3

    # A re-run computes nothing for unchanged variants, and only the changed one otherwise.
    trained: list[int] = []
    original = backbone._run_variant
    monkeypatch.setattr(
        backbone, "_run_variant", lambda *a: trained.append(a[1].model.n_head) or original(*a)
    )
    assert _run(tmp_path, PARAMS)["rows"] == table["rows"]
    assert trained == []
    changed = json.loads(json.dumps(PARAMS))
    changed["backbone"]["variants"]["four-heads"]["n_kv_head"] = 2
    changed["backbone"]["variants"]["later"] = {"d_ff": 32}
    # A share of the study (--only): the table lists the rest as not run yet.
    partial = _run(tmp_path, changed, "--only", "four-heads")
    assert trained == [4]
    assert [row.get("missing", "") for row in partial["rows"]] == ["", "", _NOT_RUN]
    assert partial["rows"][1]["model"]["n_kv_head"] == 2


def test_unknown_model_field_names_the_variant(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(PARAMS))
    bad["backbone"]["variants"]["base"] = {"n_heads": 4}
    with pytest.raises(ConfigError, match=r"backbone\.variants\.base.*n_heads"):
        _run(tmp_path, bad)


def test_recipe_variants_share_one_ar_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant that only changes the fine-tune reuses its backbone's AR model (trained once,
    kept on disk for the next run) and records the recipe it changed."""
    params = json.loads(json.dumps(PARAMS))
    params["backbone"]["variants"] = {
        "base": {},
        "base-slow-ft": {"diffusion": {"lr": 0.0003, "steps": 2}},
    }
    paradigms: list[str] = []
    original = backbone.train
    monkeypatch.setattr(
        backbone,
        "train",
        lambda net, p, *a, **k: paradigms.append(p.config.name) or original(net, p, *a, **k),
    )
    rows = {row["variant"]: row for row in _run(tmp_path, params)["rows"]}
    assert paradigms == ["ar", "setdlm", "setdlm"]
    assert rows["base-slow-ft"]["diffusion"] == {"lr": 0.0003, "steps": 2}
    assert rows["base"]["diffusion"] == {}
    assert rows["base"]["ar"] == rows["base-slow-ft"]["ar"]  # the same AR model
    assert (
        len(list((tmp_path / "results" / "backbone" / "arith" / "ar").glob("*.safetensors"))) == 1
    )

    # A new recipe variant in a later run trains no AR model either.
    paradigms.clear()
    params["backbone"]["variants"]["base-long-ft"] = {"diffusion": {"steps": 4}}
    _run(tmp_path, params)
    assert paradigms == ["setdlm"]


def test_unknown_recipe_field_names_the_variant(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(PARAMS))
    bad["backbone"]["variants"]["base"] = {"diffusion": {"learning_rate": 0.1}}
    with pytest.raises(ConfigError, match=r"backbone\.variants\.base\.diffusion.*learning_rate"):
        _run(tmp_path, bad)


def test_stored_variants_and_ar_models_are_not_reused_on_other_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = json.loads(json.dumps(PARAMS))
    del params["backbone"]["variants"]["four-heads"]
    _run(tmp_path, params)
    params["data"]["seed"] = 1  # other data: the stored row and AR model are of the old one
    args = ["--params", str(tmp_path / "params.yaml"), "--task", "arith", "--root", str(tmp_path)]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    prepare.main(args)
    tokenize.main(args)
    ran: list[str] = []
    trained_ar: list[int] = []
    original_variant, original_train = backbone._run_variant, backbone.train
    monkeypatch.setattr(
        backbone, "_run_variant", lambda *a: ran.append(a[0]) or original_variant(*a)
    )

    def spy_train(net, paradigm, *rest):  # type: ignore[no-untyped-def]
        trained_ar.extend([1] if paradigm.config.name == "ar" else [])
        return original_train(net, paradigm, *rest)

    monkeypatch.setattr(backbone, "train", spy_train)
    _run(tmp_path, params)
    assert ran == ["base"] and trained_ar == [1]
