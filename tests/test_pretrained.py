"""The paper-scale path on tiny local fixtures: GSM8K read from a local copy (hub layout or the
original jsonl), a pretrained (Qwen3-style) tokenizer as the task tokenizer with an existing token
reused as [MASK], and training stages initialised from a Hugging Face Qwen3 checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
import torch
import yaml
from checkout import copy_checkout, sh
from transformers import Qwen3Config, Qwen3ForCausalLM

from setdiff.artifacts import load_model
from setdiff.batching import ArraySplit
from setdiff.config import ConfigError
from setdiff.hf import load_pretrained_tokenizer
from setdiff.params import load_params
from setdiff.stages import prepare, preset, tokenize
from setdiff.stages import train as train_stage
from setdiff.study import StudyConfig
from setdiff.tasks import generate_splits
from setdiff.tasks.gsm8k import Gsm8kConfig, generate_gsm8k, read_gsm8k, score_gsm8k
from setdiff.tokenizer import (
    SPECIAL_MAP_FILE,
    TokenizerConfig,
    load_hf_tokenizer,
    load_tokenizer,
)

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_middle|>")
TRAIN_ROWS = [
    {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b:,}",
    }
    for a, b in [(3, 4), (10, 5), (7, 8), (2, 2), (1200, 30), (6, 1), (9, 9), (4, 5)]
]
TEST_ROWS = [
    {"question": "Ann has 2 pens and gets 3 more. How many pens?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": "A box holds 6 eggs; 2 break. How many are left?", "answer": "6-2=4\n#### 4"},
]


# ---------------------------------------------------------------------------------------------
# fixtures: a GSM8K copy, a Qwen3-style tokenizer and checkpoint


def write_gsm8k(
    directory: Path, layout: str, train: list[dict] = TRAIN_ROWS, test: list[dict] = TEST_ROWS
) -> Path:
    """GSM8K in the hub's parquet layout (``main/<split>-*.parquet``) or as the original jsonl."""
    for split, rows in (("train", train), ("test", test)):
        if layout == "parquet":
            (directory / "main").mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), directory / f"main/{split}-00000.parquet")
        else:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def write_qwen_tokenizer(directory: Path) -> Path:
    """A small byte-level BPE with Qwen's special tokens appended after the learned ids (as in
    Qwen3, where they are the last ids), no BOS, and EOS = PAD = ``<|endoftext|>``."""
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [r["question"] + " " + r["answer"] for r in TRAIN_ROWS + TEST_ROWS]
    backend.train_from_iterator(texts * 4, trainer=trainer)
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS]
    )
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def write_qwen_checkpoint(directory: Path, vocab_size: int) -> Path:
    """A random tiny Qwen3 (q/k norms, tied embeddings), saved with `save_pretrained`; its
    embedding has more rows than the tokenizer has ids, as Qwen3's 151936 > 151669."""
    config = Qwen3Config(
        vocab_size=vocab_size + 12,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pretrained")
    tokenizer_dir = write_qwen_tokenizer(root / "qwen")
    vocab = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    write_qwen_checkpoint(tokenizer_dir, vocab)
    return {
        "root": root,
        "parquet": write_gsm8k(root / "gsm8k-hub", "parquet"),
        "jsonl": write_gsm8k(root / "gsm8k-jsonl", "jsonl"),
        "qwen": tokenizer_dir,
    }


# ---------------------------------------------------------------------------------------------
# GSM8K


@pytest.mark.parametrize("layout", ["parquet", "jsonl"])
def test_gsm8k_reads_both_layouts_into_clean_records(
    layout: str, fixtures: dict[str, Path]
) -> None:
    config = Gsm8kConfig(source=str(fixtures[layout]), n_valid=2)
    splits = generate_splits("gsm8k", config, seed=0)
    assert {k: len(v) for k, v in splits.items()} == {"train": 6, "valid": 2, "test": 2}
    assert [r["question"] for r in splits["test"]] == [r["question"] for r in TEST_ROWS]
    record = next(r for r in splits["train"] + splits["valid"] if "1200" in r["question"])
    assert record["prompt"] == f"Question: {record['question']}\nAnswer:\n"
    assert record["target"] == "He has 1200 + 30 = 1230 apples.\n#### 1,230"
    assert "<<" not in "".join(r["target"] for r in splits["train"])
    assert record["answer"] == "1,230"
    held = {r["question"] for r in splits["valid"]}
    assert held.isdisjoint(r["question"] for r in splits["train"])
    assert len(held | {r["question"] for r in splits["train"]}) == len(TRAIN_ROWS)


def test_gsm8k_valid_draw_is_seeded(fixtures: dict[str, Path]) -> None:
    config = Gsm8kConfig(source=str(fixtures["jsonl"]), n_valid=3)
    draws = [generate_gsm8k(config, seed)["valid"] for seed in (0, 0, 1)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]


def test_gsm8k_caps_and_template(fixtures: dict[str, Path]) -> None:
    config = Gsm8kConfig(
        source=str(fixtures["jsonl"]), n_valid=2, n_train=3, n_test=1, template="Q: {question}\n"
    )
    splits = generate_gsm8k(config, 0)
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [3, 2, 1]
    assert splits["test"][0]["prompt"] == f"Q: {TEST_ROWS[0]['question']}\n"


def test_gsm8k_hub_ids_fetch_the_dataset_snapshot(
    fixtures: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, dict]] = []

    def fake_snapshot(repo_id: str, **kwargs: Any) -> str:
        calls.append((repo_id, kwargs))
        return str(fixtures["parquet"])

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot)
    rows = read_gsm8k("openai/gsm8k")
    patterns = ["main/*.parquet", "*.jsonl"]
    assert calls == [("openai/gsm8k", {"repo_type": "dataset", "allow_patterns": patterns})]
    assert len(rows["train"]) == len(TRAIN_ROWS)


def test_gsm8k_bad_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        read_gsm8k(str(tmp_path / "typo"))  # neither a directory nor owner/name
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no GSM8K train split"):
        read_gsm8k(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/train.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="row 0 lacks question/answer"):
        read_gsm8k(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="must contain"):
        Gsm8kConfig(template="no placeholder")


def test_gsm8k_scoring_is_numeric_exact_match() -> None:
    entry = {"question": "q", "answer": "1,230"}
    assert score_gsm8k("1230", entry) == 1.0
    assert score_gsm8k("1,230.0", entry) == 1.0
    assert score_gsm8k("1231", entry) == 0.0
    assert score_gsm8k(None, entry) == 0.0


# ---------------------------------------------------------------------------------------------
# pretrained tokenizer


def test_pretrained_tokenizer_roles_follow_qwen(fixtures: dict[str, Path]) -> None:
    tok = load_pretrained_tokenizer(
        TokenizerConfig(kind="pretrained", source=str(fixtures["qwen"]), seq_len=64)
    )
    ids = {t: tok.backend.token_to_id(t) for t in QWEN_SPECIALS}
    assert tok.eos_id == tok.bos_id == tok.pad_id == ids["<|endoftext|>"]
    assert tok.mask_id == ids["<|fim_middle|>"]
    assert tok.mask_id > 4  # not our trained layout: the ids come from the file
    text = "Tom has 3 apples."
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([tok.bos_id, *tok.encode(text), tok.eos_id]) == text


def test_pretrained_tokenizer_overrides_and_errors(
    fixtures: dict[str, Path], tmp_path: Path
) -> None:
    source = str(fixtures["qwen"])
    tok = load_pretrained_tokenizer(
        TokenizerConfig(
            kind="pretrained", source=source, seq_len=64, bos_token="<|im_start|>",
            mask_token="<|im_end|>",
        )
    )  # fmt: skip
    assert tok.bos_id == tok.backend.token_to_id("<|im_start|>")
    assert tok.mask_id == tok.backend.token_to_id("<|im_end|>")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        load_pretrained_tokenizer(
            TokenizerConfig(kind="pretrained", source=source, seq_len=64, mask_token="<nope>")
        )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((fixtures["qwen"] / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match="declares no eos_token"):
        load_pretrained_tokenizer(TokenizerConfig(kind="pretrained", source=str(bare), seq_len=8))
    with pytest.raises(ValueError, match="apply to kind pretrained only"):
        TokenizerConfig(kind="char", seq_len=8, source=source)
    with pytest.raises(ValueError, match="source is required"):
        TokenizerConfig(kind="pretrained", seq_len=8)


def test_special_roles_travel_with_the_tokenizer_file(
    fixtures: dict[str, Path], tmp_path: Path
) -> None:
    tok = load_pretrained_tokenizer(
        TokenizerConfig(kind="pretrained", source=str(fixtures["qwen"]), seq_len=64)
    )
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    assert (tmp_path / SPECIAL_MAP_FILE).exists()
    loaded = load_tokenizer(path)
    assert (loaded.pad_id, loaded.bos_id, loaded.eos_id, loaded.mask_id) == (
        tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id,
    )  # fmt: skip
    hf_tok = load_hf_tokenizer(path)
    assert hf_tok.mask_token == "<|fim_middle|>" and hf_tok.eos_token == "<|endoftext|>"


# ---------------------------------------------------------------------------------------------
# stages: prepare -> tokenize -> train (ar from the checkpoint, setdlm from that ar)


def write_stage_params(path: Path, fixtures: dict[str, Path], **model: Any) -> Path:
    recipe = {"steps": 3, "batch_size": 4, "lr": 1e-3, "warmup_steps": 1, "eval_every": 3,
              "eval_examples": 2, "checkpoint_every": 3}  # fmt: skip
    params = {
        "data": {"seed": 0, "gsm8k": {"source": str(fixtures["jsonl"]), "n_valid": 2}},
        "tokenizer": {
            "gsm8k": {"kind": "pretrained", "source": str(fixtures["qwen"]), "seq_len": 96}
        },
        "model": {"gsm8k": model or {"pretrained": str(fixtures["qwen"])}},
        "paradigm": {"ar": {}, "setdlm": {"set_size": 2}},
        "train": {"gsm8k": {"init_from_ar": True, "ar": recipe, "diffusion": dict(recipe)}},
    }
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def trained(fixtures: dict[str, Path]) -> Path:
    root = fixtures["root"] / "run"
    params = write_stage_params(fixtures["root"] / "params.yaml", fixtures)
    common = ["--params", str(params), "--root", str(root), "--task", "gsm8k"]
    prepare.main(common)
    tokenize.main(common)
    train_stage.main([*common, "--paradigm", "ar"])
    train_stage.main([*common, "--paradigm", "setdlm"])
    return root


def test_initial_net_is_the_checkpoint_and_matches_transformers(fixtures: dict[str, Path]) -> None:
    params = load_params(write_stage_params(fixtures["root"] / "p-init.yaml", fixtures))
    config = train_stage.model_config(params, "gsm8k", vocab_size=0, seq_len=96)
    net = train_stage._initial_net(config, 0, str(fixtures["qwen"]), "gsm8k").eval()
    assert net.config.max_seq_len == 96 and net.config.qk_norm
    reference = Qwen3ForCausalLM.from_pretrained(str(fixtures["qwen"])).eval()
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    T = ids.shape[1]
    with torch.no_grad():
        ours = net(ids, torch.arange(T), torch.ones(T, T, dtype=torch.bool).tril())
        theirs = reference(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_stages_train_from_the_checkpoint_with_its_tokenizer(
    trained: Path, fixtures: dict[str, Path]
) -> None:
    tokenizer_dir = trained / "data/gsm8k/tokenizer"
    assert json.loads((tokenizer_dir / SPECIAL_MAP_FILE).read_text())["mask_token"] == (
        "<|fim_middle|>"
    )
    split = ArraySplit.load(trained / "data/gsm8k/encoded/train.npz")
    tok = load_tokenizer(tokenizer_dir / "tokenizer.json")
    assert (split.tokens[:, 0] == tok.bos_id).all()
    hf_vocab = json.loads((fixtures["qwen"] / "config.json").read_text())["vocab_size"]
    for paradigm in ("ar", "setdlm"):
        model = load_model(trained / "models/gsm8k" / paradigm)
        assert model.net.config.vocab_size == hf_vocab and model.net.config.max_seq_len == 96
        assert model.paradigm.mask_id == model.tokenizer.mask_id == tok.mask_id
        assert (trained / "models/gsm8k" / paradigm / SPECIAL_MAP_FILE).exists()
    init = json.loads((trained / "models/gsm8k/ar/config.json").read_text())["init_from"]
    assert init == str(fixtures["qwen"])
    metrics = json.loads((trained / "metrics/train/gsm8k/ar.json").read_text())
    assert metrics["steps"] == 3


def test_ar_training_moves_away_from_the_checkpoint(
    trained: Path, fixtures: dict[str, Path]
) -> None:
    reference = Qwen3ForCausalLM.from_pretrained(str(fixtures["qwen"])).state_dict()
    tuned = load_model(trained / "models/gsm8k/ar").net.state_dict()
    assert set(tuned) <= set(reference)  # the same tensor names (tied lm_head included)
    changed = [k for k in tuned if not torch.equal(reference[k], tuned[k])]
    assert len(changed) == len(tuned)  # three AdamW steps move every tensor


def test_a_tokenizer_larger_than_the_model_is_refused(
    trained: Path, fixtures: dict[str, Path], tmp_path: Path
) -> None:
    small = {"n_layer": 1, "n_head": 1, "n_kv_head": 1, "d_model": 16, "d_ff": 16}
    params = write_stage_params(tmp_path / "p.yaml", fixtures, **small)
    config = train_stage.model_config(load_params(params), "gsm8k", vocab_size=100, seq_len=96)
    tok = load_tokenizer(trained / "data/gsm8k/tokenizer/tokenizer.json")
    with pytest.raises(ConfigError, match="embedding rows"):
        train_stage._check_vocabulary(config, tok, "gsm8k")


def test_pretrained_models_take_no_architecture_keys(
    fixtures: dict[str, Path], tmp_path: Path
) -> None:
    params = write_stage_params(
        tmp_path / "p.yaml", fixtures, pretrained=str(fixtures["qwen"]), n_layer=2
    )
    with pytest.raises(ConfigError, match=r"\['n_layer'\] come from the pretrained checkpoint"):
        train_stage.model_config(load_params(params), "gsm8k", vocab_size=0, seq_len=96)


# ---------------------------------------------------------------------------------------------
# presets


def test_paper_preset_validates_offline_without_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("preset validation must not fetch anything")

    monkeypatch.setattr("huggingface_hub.snapshot_download", no_network)
    params = load_params(Path(__file__).parents[1] / "params/paper-gsm8k.yaml")
    study = preset.validate(params)
    assert study.tasks == ("gsm8k",)
    assert params.get_path("model.gsm8k") == {"pretrained": "Qwen/Qwen3-1.7B-Base"}
    assert params.get_path("tokenizer.gsm8k.seq_len") == 1024


def test_a_study_stage_list_stays_within_the_tasks() -> None:
    """(What each stage's list may hold beyond that is the stage's own rule: tests/test_params.)"""
    with pytest.raises(ValueError, match="floor: \\['gsm'\\] not in tasks"):
        StudyConfig(tasks=("arith", "text"), stage_tasks={"floor": ("gsm",)})


def test_gsm8k_asking_for_more_than_there_is_fails(fixtures: dict[str, Path]) -> None:
    config = Gsm8kConfig(source=str(fixtures["jsonl"]), n_valid=2, n_train=7)
    with pytest.raises(ValueError, match="n_train 7 > 6 available"):
        generate_gsm8k(config, 0)


# ---------------------------------------------------------------------------------------------
# the paper-gsm8k preset end to end, on stand-ins


def stand_in_preset(fixtures: dict[str, Path], gsm8k: Path) -> dict[str, Any]:
    """params/paper-gsm8k.yaml with its sources pointed at the tiny stand-ins and its sizes,
    devices and budgets cut to CPU minutes; every other key (stages, sweeps, grid) as shipped."""
    params = yaml.safe_load((Path(__file__).parents[1] / "params/paper-gsm8k.yaml").read_text())
    params["preset"] = "paper-stand-in"
    params["data"]["gsm8k"].update(source=str(gsm8k), n_valid=10)
    params["tokenizer"]["gsm8k"].update(source=str(fixtures["qwen"]), seq_len=64)
    params["model"]["gsm8k"] = {"pretrained": str(fixtures["qwen"])}
    small = {"steps": 10, "batch_size": 8, "micro_batch_size": 4, "lr": 1e-3, "warmup_steps": 2,
             "eval_every": 5, "eval_examples": 10, "checkpoint_every": 5, "device": "cpu",
             "dtype": "float32", "threads": 1, "ema_decay": 0.0}  # fmt: skip
    for recipe in ("ar", "diffusion"):
        params["train"]["gsm8k"][recipe].update(small)
    cpu = {"device": "cpu", "threads": 1}
    params["evaluate"].update(n_likelihood=10, n_answers=6, batch_size=4, **cpu)
    params["bench"]["run"].update(n_examples=4, n_select=4, warmup=1, **cpu)
    params["baseline"].update(engines=["transformers"], n_examples=3, warmup=1, **cpu)
    params["lmeval"].update(**cpu)  # a CUDA device on a CPU machine is refused, not swapped
    budget = {"n_trials": 3, "batch": 3, "n_examples": 3, "train_steps": 6, "eval_every": 3,
              "timeout_s": 600, "workers": 1}  # fmt: skip
    params["ablation"]["budget"].update(budget)
    params["ablation"]["pruning"]["warmup_steps"] = 3
    return params


@pytest.mark.slow
def test_paper_preset_pipeline_runs_end_to_end_on_stand_ins(
    fixtures: dict[str, Path], tmp_path: Path
) -> None:
    """`dvc repro` of the paper-gsm8k preset's stage graph (pretrained tokenizer and init, gsm8k,
    floor, bench over the tau grid, the Qwen3 HF export, ablation, report) with tiny stand-ins."""
    rows = [
        {
            "question": f"Tom has {a} apples and buys {b} more. How many?",
            "answer": f"{a}+{b}=<<{a}+{b}={a + b}>>{a + b}\n#### {a + b}",
        }
        for a in range(1, 9)
        for b in range(1, 9)
    ]
    gsm8k = write_gsm8k(tmp_path / "gsm8k", "parquet", rows[:56], rows[56:])
    repo = copy_checkout(tmp_path / "repo")
    preset_file = repo / "params/paper-stand-in.yaml"
    preset_file.write_text(yaml.safe_dump(stand_in_preset(fixtures, gsm8k), sort_keys=False))
    sh("setdiff", "preset", "paper-stand-in", cwd=repo)
    run = sh("dvc", "repro", cwd=repo, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "up to date" in sh("dvc", "status", cwd=repo).stdout
    for paradigm in ("ar", "mdlm", "bd3lm", "setdlm"):
        special = json.loads((repo / "models/gsm8k" / paradigm / SPECIAL_MAP_FILE).read_text())
        assert special["mask_token"] == "<|fim_middle|>"
    export = json.loads((repo / "models/gsm8k/ar-hf/config.json").read_text())
    assert export["architectures"] == ["Qwen3ForCausalLM"]
    with open(repo / "results/bench/gsm8k.csv") as f:
        bench = [row for row in csv.DictReader(f) if row["paradigm"] == "setdlm"]
    assert len({row["threshold"] for row in bench}) == 10  # the paper's tau grid
    assert len(bench) == 10 * 4  # x the stand-in's 4 bench prompts
    for path in ("metrics/floor/gsm8k.json", "metrics/ablation/gsm8k.json",
                 "metrics/tradeoff/gsm8k.json", "reports/out/report.md"):  # fmt: skip
        assert (repo / path).exists(), path
