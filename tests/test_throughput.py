"""The throughput sweep: batched figures, the batch-1 identity check, config parsing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import yaml

from setdiff import measure
from setdiff.artifacts import LoadedModel, save_model_dir
from setdiff.bench import throughput
from setdiff.bench.config import configurations
from setdiff.bench.throughput import Method, parse_config, sweep
from setdiff.config import ConfigError
from setdiff.evaluate import answer_rows
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm
from setdiff.stages import bench, tokenize
from setdiff.tasks.records import to_jsonl
from setdiff.tokenizer import Tokenizer, TokenizerConfig, load_tokenizer, train_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

RECORDS = [
    {"prompt": f"{a}+{b}=", "target": f"{a}+{b}={a + b} #{a + b}", "entry": {"answer": str(a + b)}}
    for a in range(1, 8)
    for b in range(1, 3)
]


def _net(vocab_size: int) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size, n_layer=1, n_head=2, n_kv_head=1, d_model=16, d_ff=32, max_seq_len=16
    )
    net = Transformer(config).float().eval()
    with torch.no_grad():  # spread the confidences of an untrained model
        net.lm_head.weight.mul_(20.0)
    return net


def _model(paradigm: str) -> LoadedModel:
    texts = [r[k] for r in RECORDS for k in ("prompt", "target")]
    tokenizer = Tokenizer(train_tokenizer(texts, TokenizerConfig(kind="char", seq_len=16)))
    net = _net(tokenizer.vocab_size)
    return LoadedModel(net, make_paradigm(paradigm, mask_id=tokenizer.mask_id), tokenizer, Path())


def test_sweep_figures_and_batch1_identity() -> None:
    methods = [
        Method("ar", "default", _model("ar"), {}),
        Method(
            "setdlm", "window=2 threshold=0.5", _model("setdlm"), {"window": 2, "threshold": 0.5}
        ),
        Method("mdlm", "chunk_size=4", _model("mdlm"), {"chunk_size": 4}),
    ]
    figures = sweep(methods, RECORDS, RECORDS[:1], [1, 4, 16], task="arith", seq_len=16)
    assert len(figures) == 9
    by = {(f["paradigm"], f["batch_size"]): f for f in figures}
    for (paradigm, _), f in by.items():
        assert f["n_examples"] == len(RECORDS)
        assert f["identical_to_batch1"] is True
        assert f["accuracy"] == by[(paradigm, 1)]["accuracy"]  # same tokens, same score
        assert f["score"] == by[(paradigm, 1)]["score"]
        assert f["accuracy"] <= f["score"]  # exact match; the score gives partial credit
        assert f["new_tokens"] == by[(paradigm, 1)]["new_tokens"]
        assert f["tokens_per_second"] > 0 and f["cpu_seconds"] > 0
        assert f["batched_forwards"] <= f["nfe_mean"] * f["n_examples"]
    assert by[("ar", 4)]["speedup_vs_ar"] == 1.0
    # at B = 16 the 14 prompts take one batch: as many forwards as the slowest row
    assert by[("ar", 16)]["batched_forwards"] < by[("ar", 1)]["batched_forwards"]


def test_identical_rows_and_draft_acceptance() -> None:
    """A lossless decode (setdlm verify) counts as identical to its reference (setdlm at W = 1)
    on every row, at every batch size; the drafts' acceptance rate is reported where it drafts."""
    model = _model("setdlm")
    shifted = dataclasses.replace(
        model,
        paradigm=make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=model.tokenizer.mask_id),
    )
    methods = [
        Method("ar", "default", _model("ar"), {}),
        Method("setdlm", "window=1", shifted, {"window": 1}),
        Method("setdlm", "verify=true window=4", shifted, {"window": 4, "verify": True}),
        Method("mdlm", "chunk_size=4", _model("mdlm"), {"chunk_size": 4}),
    ]
    figures = sweep(methods, RECORDS, RECORDS[:1], [1, 4], task="arith", seq_len=16)
    by = {(f["config"], f["batch_size"]): f for f in figures}
    for b in (1, 4):
        verify = by[("verify=true window=4", b)]
        assert verify["identical_rows"]["setdlm window=1"] == len(RECORDS)
        assert verify["drafts_checked"] > 0 and 0 <= verify["draft_acceptance"] <= 1
        assert by[("window=1", b)]["draft_acceptance"] is None
        assert set(verify["identical_rows"]) == {
            "ar default",
            "setdlm window=1",
            "mdlm chunk_size=4",
        }
        # another decode is counted as such: mdlm's rows are not setdlm's
        assert verify["identical_rows"]["mdlm chunk_size=4"] < len(RECORDS)


def test_parse_config() -> None:
    assert parse_config("ar:") == ("ar", "default", {})
    assert parse_config("setdlm:window=2,threshold=0.9") == (
        "setdlm",
        "window=2 threshold=0.9",
        {"window": 2, "threshold": 0.9},
    )
    assert parse_config("aogpt:window=none")[2] == {"window": None}
    assert parse_config("setdlm:verify=true,window=4")[2] == {"verify": True, "window": 4}
    assert parse_config("setdlm:verify=False")[2] == {"verify": False}
    with pytest.raises(ConfigError, match="unknown paradigm 'gpt'"):
        parse_config("gpt:window=2")
    with pytest.raises(ConfigError, match="key=value"):
        parse_config("setdlm:window")


# ---------------------------------------------------------------------------------------------
# the bench stage's throughput sweep

STAGE_PARAMS: dict[str, Any] = {
    "tokenizer": {"arith": {"kind": "char", "seq_len": 16}},
    "decode": {"ar": {}, "setdlm": {"window": 2}},
    "bench": {
        "run": {
            "n_examples": 3,
            "warmup": 1,
            "threads": 1,
            "throughput": {
                "batch_sizes": [1, 4],
                "n_examples": 5,
                "configs": ["setdlm threshold=0.5"],
            },
        },
        "sweep": {"setdlm": {"threshold": ["off", 0.5]}},
    },
    "study": {"tasks": ["arith"], "paradigms": ["ar", "setdlm"], "diffusion": ["setdlm"]},
}


def _repo(root: Path, params: dict[str, Any]) -> Path:
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    raw = root / "data" / "arith" / "raw"
    raw.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (raw / f"{split}.jsonl").write_bytes(to_jsonl(RECORDS))
    _run(tokenize, root)
    tokenizer_file = root / "data/arith/tokenizer/tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_file)
    for paradigm in ("ar", "setdlm"):
        save_model_dir(
            root / "models/arith" / paradigm,
            _net(tokenizer.vocab_size),
            make_paradigm(paradigm, mask_id=tokenizer.mask_id),
            tokenizer_file=tokenizer_file,
            extra={"task": "arith"},
        )
    return root


def _run(stage: Any, root: Path) -> None:
    stage.main(["--params", str(root / "params.yaml"), "--task", "arith", "--root", str(root)])


def test_bench_stage_writes_the_throughput_sweep(tmp_path: Path) -> None:
    root = _repo(tmp_path, STAGE_PARAMS)
    _run(bench, root)
    out = json.loads((root / "results/throughput/arith.json").read_text())
    assert out["batch_sizes"] == [1, 4]
    assert out["methods"] == ["ar default", "setdlm threshold=0.5"]
    assert {(f["method"], f["batch_size"]) for f in out["figures"]} == {
        (m, b) for m in out["methods"] for b in (1, 4)
    }
    assert [(f["identical_to_batch1"], f["n_examples"]) for f in out["figures"]] == [(True, 5)] * 4


def test_transformers_batched_ar_runs_side_by_side_and_decodes_our_ar_tokens(
    tmp_path: Path,
) -> None:
    params = json.loads(json.dumps(STAGE_PARAMS))
    params["bench"]["run"]["throughput"]["transformers"] = True
    root = _repo(tmp_path, params)
    _run(bench, root)
    out = json.loads((root / "results/throughput/arith.json").read_text())
    hf = [f for f in out["figures"] if f["method"] == "ar transformers"]
    assert [f["batch_size"] for f in hf] == [1, 4]
    # the same greedy tokens as our AR on every row, at every batch size
    assert [f["identical_rows"]["ar default"] for f in hf] == [5, 5]
    assert all(f["tokens_per_forward"] == pytest.approx(1.0) for f in hf)
    best = out["against_best_ar"]["setdlm threshold=0.5"]
    assert set(best["best_ar"].values()) <= {"ar default", "ar transformers"}
    assert set(best["crossover_vs"]) == {"ar default", "ar transformers"}


def test_ratio_to_the_best_ar_engine_and_the_crossover() -> None:
    def rows(method: str, paradigm: str, speeds: list[float]) -> list[dict[str, Any]]:
        return [
            {"method": method, "paradigm": paradigm, "batch_size": b, "tokens_per_second": v}
            for b, v in zip((1, 4, 16), speeds, strict=True)
        ]

    figures = [
        *rows("ar default", "ar", [100, 200, 400]),
        *rows("ar transformers", "ar", [80, 300, 800]),
        *rows("setdlm w4", "setdlm", [220, 330, 500]),
    ]
    out = throughput.against_best_ar(figures)["setdlm w4"]
    assert out["best_ar"] == {"1": "ar default", "4": "ar transformers", "16": "ar transformers"}
    assert out["ratio_to_best_ar"] == pytest.approx({"1": 2.2, "4": 1.1, "16": 0.625})
    assert out["crossover"] == 16
    assert out["crossover_vs"] == {"ar default": None, "ar transformers": 16}


def test_throughput_accuracy_is_the_bench_rows_exact_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the same test prompts the throughput sweep's accuracy of a configuration is the bench
    rows' exact-match accuracy of that configuration (the tradeoff stage's measure), and its
    score the rows' mean score, so the accuracy condition of a throughput ratio can be read off
    either. Untrained models answer nothing right, so the task's scorer is replaced by one
    that gives 0, 1/2 or 1 by the decoded text: exact match and mean score then differ."""

    def scorer(task: str, text: str, record: dict[str, Any]) -> tuple[str, float]:
        return text, (sum(text.encode()) % 3) / 2

    monkeypatch.setattr(measure, "score_answer", scorer)
    monkeypatch.setattr(throughput, "score_answer", scorer)
    params = json.loads(json.dumps(STAGE_PARAMS))
    params["bench"]["run"]["n_examples"] = params["bench"]["run"]["throughput"]["n_examples"] = 8
    root = _repo(tmp_path, params)
    _run(bench, root)
    rows = pd.read_csv(root / "results/bench/arith.csv")
    rows = rows[rows["regime"] == "latency"]
    figures = json.loads((root / "results/throughput/arith.json").read_text())["figures"]
    for f in figures:
        label = f["config"] if f["paradigm"] != "ar" else "default"
        exact = rows[(rows["paradigm"] == f["paradigm"]) & (rows["config"] == label)]["exact"]
        assert len(exact) == 8, (f["method"], sorted(set(rows["config"])))
        assert f["accuracy"] == pytest.approx(exact.mean()), f["method"]
        assert f["score"] == pytest.approx(rows.loc[exact.index, "score"].mean()), f["method"]
    assert any(f["accuracy"] < f["score"] for f in figures)  # the scorer's partial credit shows


def test_bench_stage_throughput_off_and_unknown_config(tmp_path: Path) -> None:
    params = json.loads(json.dumps(STAGE_PARAMS))
    params["bench"]["run"]["throughput"] = {"configs": ["setdlm threshold=0.7 window=2"]}
    root = _repo(tmp_path, params)
    with pytest.raises(
        ConfigError, match=r"throughput.configs: \['setdlm threshold=0.7 window=2'\]"
    ):
        _run(bench, root)
    params["bench"]["run"]["throughput"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    _run(bench, root)
    out = json.loads((root / "results/throughput/arith.json").read_text())
    assert out["batch_sizes"] == [] and out["figures"] == []


@pytest.mark.parametrize(
    ("paradigm", "options"),
    [("ar", {}), ("setdlm", {"window": 2, "threshold": 0.5}), ("mdlm", {"chunk_size": 1})],
)
def test_batched_answer_rows_equal_one_at_a_time(paradigm: str, options: dict[str, Any]) -> None:
    """The scorers that decode in batches (training curves, retrain.score) get the same rows."""
    records = [  # prompts of 4 to 7 characters, batched together
        {"prompt": f"{a}+{b}=", "entry": {"answer": str(a + b)}, "answer": str(a + b)}
        for a in (1, 3, 12, 45, 7, 103)
        for b in (2, 9, 30)
    ]
    model = _model(paradigm)
    kw: dict[str, Any] = dict(task="arith", seq_len=16, decode_options=options)
    alone = answer_rows(model, records, show_progress=False, **kw)
    batched = answer_rows(model, records, show_progress=False, batch_size=5, **kw)
    timing = ("seconds", "forward_seconds")
    assert [{k: v for k, v in r.items() if k not in timing} for r in batched] == [
        {k: v for k, v in r.items() if k not in timing} for r in alone
    ]
    assert len({r["text"] for r in alone}) > 1 < len({r["prompt_tokens"] for r in alone})
    with pytest.raises(ValueError, match="batch_size"):
        answer_rows(model, records, batch_size=0, **kw)


def test_sweep_grids_union_and_errors() -> None:
    """A paradigm's sweep is one grid (every combination) or a list of grids (their union)."""
    decode = {"mdlm": {"chunk_size": 1}, "ar": {}}.__getitem__
    sweep_spec = {"mdlm": [{"chunk_size": [1]}, {"chunk_size": [40], "threshold": ["off", 0.9]}]}
    got = configurations(sweep_spec, decode, ("ar", "mdlm"), "p.yaml")
    assert [(c.paradigm, c.label, c.options) for c in got] == [
        ("ar", "default", {}),
        ("mdlm", "chunk_size=1", {"chunk_size": 1}),
        ("mdlm", "chunk_size=40 threshold=off", {"chunk_size": 40, "threshold": "off"}),
        ("mdlm", "chunk_size=40 threshold=0.9", {"chunk_size": 40, "threshold": 0.9}),
    ]
    grid = configurations({"mdlm": {"chunk_size": [1, 40]}}, decode, ("mdlm",), "p.yaml")
    assert [c.label for c in grid] == ["chunk_size=1", "chunk_size=40"]
    bad = {
        "listed twice": {"mdlm": [{"chunk_size": [1]}, {"chunk_size": [1, 8]}]},
        "need a grid or a list of grids": {"mdlm": [["chunk_size"]]},
        "need a non-empty list": {"mdlm": [{"chunk_size": []}]},
        "not in the study": {"bd3lm": {"threshold": [0.9]}},
    }
    for message, spec in bad.items():
        with pytest.raises(ConfigError, match=f"p.yaml: bench.sweep.*{message}"):
            configurations(spec, decode, ("ar", "mdlm"), "p.yaml")


def test_the_report_fixture_is_what_the_bench_writes() -> None:
    """The report tests' synthetic run (tests/report/report_run.py) feeds the report a
    hand-written ``against_best_ar``; it must be what this function computes from the same
    figures, or the report is tested on a fiction."""
    from metrics_records import AGAINST_BEST_AR, BATCHED

    assert throughput.against_best_ar(BATCHED) == AGAINST_BEST_AR
