"""lm-evaluation-harness integration, end to end on a tiny trained arith model.

The fixture trains a tiny AR model to memorise 24 sums and saves it as ``ar`` and (untrained
fine-tune, the same weights) as ``setdlm``; every third test reference is made wrong, so both
scorers must give a mixed verdict. lm-eval (our ``setdiff`` model type and ``setdiff_arith`` task)
must then give the evaluate stage's accuracy, text for text. vLLM runs only where its CPU
environment is installed (``make vllm-env``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is the optional extra .[eval]")

from lm_eval.api.instance import Instance  # noqa: E402

import setdiff.lmeval  # noqa: E402  (registers the model type)
from setdiff.artifacts import save_model_dir  # noqa: E402
from setdiff.baselines.vllm_server import find_vllm_python  # noqa: E402
from setdiff.batching import ArraySplit  # noqa: E402
from setdiff.lmeval.__main__ import main as lmeval_cli  # noqa: E402
from setdiff.lmeval.model import SetdiffLM  # noqa: E402
from setdiff.model import ModelConfig, Transformer  # noqa: E402
from setdiff.paradigm import Batch, make_paradigm  # noqa: E402
from setdiff.stages import evaluate as evaluate_stage  # noqa: E402
from setdiff.stages import lmeval as lmeval_stage  # noqa: E402
from setdiff.stages import tokenize  # noqa: E402
from setdiff.tasks.records import to_jsonl  # noqa: E402
from setdiff.tokenizer import load_tokenizer  # noqa: E402
from setdiff.train import TrainConfig, train  # noqa: E402

PAIRS = [(a, b) for a in range(1, 9) for b in range(1, 4)]
RECORDS = [
    {
        "prompt": f"{a}+{b}=",
        "target": f"{a}+{b}={a + b} #{a + b}",
        "answer": str(a + b),
        "question": f"{a} + {b} =",
        "entry": {"answer": str(a + b)},
    }
    for a, b in PAIRS
]
WRONG = {i for i in range(len(RECORDS)) if i % 3 == 0}
"""Test records whose reference is off by one: a right model scores 0 there."""
DECODE = {"ar": {}, "setdlm": {"window": 2}}
PARAMS: dict[str, Any] = {
    "tokenizer": {"arith": {"kind": "char", "seq_len": 16}},
    "evaluate": {"n_likelihood": 4, "n_answers": len(RECORDS), "batch_size": 8, "threads": 1},
    "decode": DECODE,
    "lmeval": {"n_examples": len(RECORDS), "paradigms": ["ar", "setdlm"], "threads": 1},
}


def wrong_reference(record: dict[str, Any]) -> dict[str, Any]:
    answer = str(int(record["answer"]) + 1)
    return {**record, "answer": answer, "entry": {"answer": answer}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lmeval")
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    raw = root / "data/arith/raw"
    raw.mkdir(parents=True)
    test = [wrong_reference(r) if i in WRONG else r for i, r in enumerate(RECORDS)]
    for split, records in (("train", RECORDS), ("valid", RECORDS), ("test", test)):
        (raw / f"{split}.jsonl").write_bytes(to_jsonl(records))
    stage(tokenize, root)
    tokenizer_file = root / "data/arith/tokenizer/tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_file)
    torch.manual_seed(0)
    # head dim 32: vLLM's CPU build refuses 16
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, n_kv_head=2, d_model=64, d_ff=128,
        max_seq_len=16,
    )  # fmt: skip
    net = Transformer(config)
    split = ArraySplit.load(root / "data/arith/encoded/train.npz")
    ar = make_paradigm("ar", mask_id=tokenizer.mask_id)
    steps = TrainConfig(
        steps=300, batch_size=24, lr=1e-2, warmup_steps=10, eval_every=300, eval_examples=8,
        checkpoint_every=300, threads=1,
    )  # fmt: skip
    train(net, ar, split, split, steps, show_progress=False)
    for name in ("ar", "setdlm"):
        paradigm = ar if name == "ar" else make_paradigm("setdlm", mask_id=tokenizer.mask_id)
        save_model_dir(
            root / "models/arith" / name,
            net.eval(),
            paradigm,
            tokenizer_file=tokenizer_file,
            extra={"task": "arith"},
        )
    return root


def stage(module: Any, root: Path) -> None:
    module.main(["--params", str(root / "params.yaml"), "--task", "arith", "--root", str(root)])


def run_lmeval(root: Path, model_args: str, **kwargs: Any) -> dict[str, Any]:
    return lm_eval.simple_evaluate(
        model="setdiff",
        model_args=model_args,
        tasks=["setdiff_arith"],
        task_manager=setdiff.lmeval.task_manager(metadata={"root": str(root)}),
        log_samples=True,
        verbosity="WARNING",
        **kwargs,
    )


def args_of(root: Path, paradigm: str) -> str:
    options = "".join(f",{k}={v}" for k, v in DECODE[paradigm].items())
    return f"path={root}/models/arith/{paradigm}{options}"


# ---------------------------------------------------------------------------------------------
# accuracy: lm-eval equals the evaluate stage


@pytest.mark.parametrize("paradigm", ["ar", "setdlm"])
def test_lmeval_accuracy_equals_the_evaluate_stage(repo: Path, paradigm: str) -> None:
    evaluate_stage.main(
        ["--params", str(repo / "params.yaml"), "--task", "arith", "--paradigm", paradigm,
         "--root", str(repo)]
    )  # fmt: skip
    ours = json.loads((repo / f"metrics/evaluate/arith/{paradigm}.json").read_text())
    rows = [json.loads(line) for line in (repo / f"metrics/evaluate/arith/{paradigm}.samples.jsonl")
            .read_text().splitlines()]  # fmt: skip
    out = run_lmeval(repo, args_of(repo, paradigm))
    samples = sorted(out["samples"]["setdiff_arith"], key=lambda s: s["doc_id"])
    assert len(samples) == ours["n_answers"] == len(RECORDS)
    assert out["results"]["setdiff_arith"]["exact_match,strict-match"] == ours["accuracy"]
    for row, sample in zip(rows, samples, strict=False):  # the evaluate stage keeps 20 texts
        assert sample["resps"][0][0] == row["text"]
        assert sample["exact_match"] == row["exact"]
    assert out["config"]["setdiff"]["decode_options"] == DECODE[paradigm]
    if paradigm == "ar":  # the trained model gets the sums right, the planted wrong ones wrong
        assert 0.5 <= ours["accuracy"] <= 1 - len(WRONG) / len(RECORDS)


def test_the_stage_writes_lmeval_results_beside_ours_and_says_why_vllm_is_skipped(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SETDIFF_VLLM_PYTHON", str(repo / "no-such-python"))
    stage(lmeval_stage, repo)
    summary = json.loads((repo / "metrics/lmeval/arith/summary.json").read_text())
    assert summary["n_examples"] == len(RECORDS)
    for paradigm in ("ar", "setdlm"):
        row = summary["engines"][paradigm]
        assert row["lmeval_accuracy"] == row["setdiff_accuracy"]
        assert row["same_text"] == row["same_verdict"] == row["n"] == len(RECORDS)
        assert row["disagreements"] == []
        results = json.loads((repo / f"metrics/lmeval/arith/{paradigm}.json").read_text())
        assert "samples" not in results
        assert (
            results["results"]["setdiff_arith"]["exact_match,strict-match"]
            == (row["lmeval_accuracy"])
        )
    vllm = summary["engines"]["vllm"]
    assert vllm["status"] == "skipped"
    assert "no-such-python" in vllm["reason"]
    from reports.inputs.run import load_run
    from reports.render import tables

    table = tables.lmeval_table(load_run(repo).lmeval).set_index("engine")
    assert (
        table.loc["ar · setdiff", "lm-eval accuracy"]
        == f"{summary['engines']['ar']['lmeval_accuracy']:.3f}"
    )
    assert table.loc["ar · setdiff", "same text"] == f"{len(RECORDS)}/{len(RECORDS)}"
    assert table.loc["ar · vLLM (local-completions)", "status"].startswith("skipped: ")


@pytest.mark.slow
@pytest.mark.skipif(find_vllm_python() is None, reason="no vLLM environment (make vllm-env)")
def test_vllm_through_lm_eval_local_completions_matches_our_ar(repo: Path) -> None:
    params = {**PARAMS, "lmeval": {**PARAMS["lmeval"], "paradigms": ["ar"]}}
    params["lmeval"]["vllm"] = {"on_unavailable": "fail"}
    (repo / "vllm-params.yaml").write_text(yaml.safe_dump(params))
    lmeval_stage.main(
        ["--params", str(repo / "vllm-params.yaml"), "--task", "arith", "--root", str(repo)]
    )
    summary = json.loads((repo / "metrics/lmeval/arith/summary.json").read_text())
    vllm, ar = summary["engines"]["vllm"], summary["engines"]["ar"]
    assert vllm["status"] == "ran", vllm
    assert vllm["same_text"] == len(RECORDS), vllm["disagreements"]
    assert vllm["lmeval_accuracy"] == ar["setdiff_accuracy"] == ar["lmeval_accuracy"]


# ---------------------------------------------------------------------------------------------
# the CLI: offline end to end, one-line errors


def test_lm_eval_cli_runs_offline(repo: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "setdiff.lmeval", "--model", "setdiff",
        "--model_args", args_of(repo, "setdlm"), "--tasks", "setdiff_arith",
        "--metadata", json.dumps({"root": str(repo)}), "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(written.read_text())
    assert results["config"]["setdiff"]["paradigm"] == "setdlm"
    assert "exact_match,strict-match" in results["results"]["setdiff_arith"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ({"path": "models/arith/setdlm", "windw": 4}, "windw"),
        ({"path": "models/arith/ar", "window": 4}, "window"),
        ({"path": "models/arith"}, "models/arith is not a setdiff model directory"),
        ({"path": "data/arith/tokenizer"}, "not a setdiff model directory"),
        ({"path": "hf-like"}, "no paradigm record"),
        ({"path": "models/arith/ar", "paradigm": "setdlm"}, "holds a 'ar' model"),
        ({"path": "models/arith/ar", "seed": "x"}, "seed"),
        ({"path": "models/arith/ar", "device": "gpu9"}, "device"),
    ],
)
def test_bad_model_args_are_refused_in_one_line(
    repo: Path, args: dict[str, Any], names: str
) -> None:
    (repo / "hf-like").mkdir(exist_ok=True)  # a Hugging Face directory, not ours
    (repo / "hf-like/config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        SetdiffLM(**{**args, "path": str(repo / args["path"])})
    assert names in str(info.value) and "\n" not in str(info.value)


def test_the_cli_reports_a_bad_decode_option_in_one_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "setdiff", "--model_args", f"path={repo}/models/arith/setdlm,windw=4"]
    with pytest.raises(SystemExit) as exit_info:
        lmeval_cli([*argv, "--tasks", "setdiff_arith"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err  # lm-eval's own INFO log lines come first
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: model_args: ") and "windw" in last, err
    assert sum(line.startswith("error: ") for line in err.splitlines()) == 1, err


def test_registered_beside_lm_evals_own_models() -> None:
    from lm_eval.api.registry import get_model

    assert get_model("setdiff") is SetdiffLM
    assert get_model("local-completions").__name__ == "LocalCompletionsAPI"


# ---------------------------------------------------------------------------------------------
# the LM API: stop sequences, likelihood exact for ar and a bound otherwise


def request(kind: str, *args: Any) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


@pytest.mark.parametrize("paradigm", ["ar", "setdlm"])
def test_generate_until_stops_at_the_requests_stop_strings(repo: Path, paradigm: str) -> None:
    lm = SetdiffLM(path=str(repo / "models/arith" / paradigm), **DECODE[paradigm])
    (full,) = lm.generate_until([request("generate_until", "7+2=", {"until": []})])
    assert len(full) >= 4, full
    stop = full[2:4]
    (cut,) = lm.generate_until([request("generate_until", "7+2=", {"until": ["@@", stop]})])
    assert cut == full[: full.index(stop)]
    with pytest.raises(ValueError, match="generation_kwargs: .*wndow"):
        lm.generate_until([request("generate_until", "7+2=", {"until": [], "wndow": 1})])
    with pytest.raises(ValueError, match=r"generation_kwargs: until\[1\] is empty"):
        lm.generate_until([request("generate_until", "7+2=", {"until": ["@@", ""]})])


def test_loglikelihood_is_exact_for_ar(repo: Path) -> None:
    lm = SetdiffLM(path=str(repo / "models/arith/ar"))
    [(logp, greedy), (worse, not_greedy)] = lm.loglikelihood(
        [request("loglikelihood", "7+2=", "7+2=9 #9"), request("loglikelihood", "7+2=", "7+2=8")]
    )
    tok = lm.tok
    ids = [tok.bos_id, *tok.encode("7+2=7+2=9 #9")]
    batch = Batch(torch.tensor([ids]), torch.tensor([5]), torch.tensor([len(ids)]))
    reference = lm.model.paradigm.loss(lm.model.net, batch).nll_sum[0]
    assert logp == pytest.approx(-float(reference), abs=1e-4)
    assert greedy and not not_greedy and worse < logp < 0
    (rolling,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", "7+2=7+2=9 #9")])
    [(whole, _)] = lm.loglikelihood([request("loglikelihood", "", "7+2=7+2=9 #9")])
    assert rolling == pytest.approx(whole, abs=1e-4)
    (long,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", "1+2=1+2=3 #3 " * 4)])
    assert long < 0 and math.isfinite(long)  # several windows of the 16-token context
    assert lm.get_model_info()["setdiff"]["likelihood"] == "exact"


def test_loglikelihood_is_a_bound_for_the_other_paradigms(repo: Path) -> None:
    lm = SetdiffLM(path=str(repo / "models/arith/setdlm"), window=2, mc_samples=2)
    [(bound, greedy)] = lm.loglikelihood([request("loglikelihood", "7+2=", "7+2=9 #9")])
    [(again, _)] = lm.loglikelihood([request("loglikelihood", "7+2=", "7+2=9 #9")])
    assert bound < 0 and not greedy and again == bound  # seeded
    info = lm.get_model_info()["setdiff"]
    assert info["likelihood"] == "bound" and "lower bound" in info["likelihood_note"]


def test_results_are_written_without_this_checkouts_path_or_the_clock(tmp_path: Path) -> None:
    from setdiff.stages.lmeval import portable

    source = str(tmp_path.resolve() / "setdiff" / "lmeval" / "tasks" / "arith.yaml")
    results = {
        "date": 1796109542.9,
        "pretty_env_info": "PyTorch version: ...",
        "git_hash": "eacd28d",
        "configs": {"setdiff_arith": {"dataset_kwargs": {"source": source}, "num_fewshot": 0}},
        "results": {"setdiff_arith": {"exact_match,strict-match": 0.5}},
    }
    assert portable(results, tmp_path) == {
        "configs": {
            "setdiff_arith": {
                "dataset_kwargs": {"source": "setdiff/lmeval/tasks/arith.yaml"},
                "num_fewshot": 0,
            }
        },
        "results": {"setdiff_arith": {"exact_match,strict-match": 0.5}},
    }
