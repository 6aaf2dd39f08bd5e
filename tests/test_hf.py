"""HF conversion: export of AR models (logits, greedy tokens, tokenizer) and import of Llama /
Qwen3 checkpoints into our backbone, all on tiny random float32 models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import setdiff
from setdiff import hf
from setdiff.artifacts import save_model_dir
from setdiff.baselines.hf_engine import hf_generate, hf_generate_batch, load_hf_model
from setdiff.hf import choose_mask_id, export_hf, load_hf_backbone, model_config_from_hf
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.tokenizer import Tokenizer, TokenizerConfig, load_tokenizer, train_tokenizer

TEXTS = ["hello world", "the quick brown fox", "jumps over 12 lazy dogs\n"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(TEXTS, TokenizerConfig(kind="char", seq_len=32)).save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file: Path) -> Tokenizer:
    return load_tokenizer(tokenizer_file)


def random_backbone(vocab_size: int, seed: int = 0, **overrides: Any) -> Transformer:
    """A tiny AR backbone (head dim 64, as vLLM's CPU kernels need) with non-trivial norms and
    a sharpened head, so greedy decoding has clear winners."""
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size, n_layer=2, n_head=2, n_kv_head=1, d_model=128, d_ff=256
    )
    kwargs.update(max_seq_len=64, rope_theta=5000.0, **overrides)
    torch.manual_seed(seed)
    net = Transformer(ModelConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):  # biases start at zero: make them count
                p.copy_(0.1 * torch.randn_like(p))
        net.lm_head.weight.mul_(8)
    return net


def causal_logits(net: Transformer, ids: torch.Tensor) -> torch.Tensor:
    T = ids.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    with torch.no_grad():
        return net(ids, torch.arange(T), mask)


def save_ar(directory: Path, net: Transformer, tokenizer_file: Path, mask_id: int) -> Path:
    save_model_dir(
        directory, net, make_paradigm("ar", mask_id=mask_id), tokenizer_file=tokenizer_file
    )
    return directory


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_file: Path, tokenizer: Tokenizer
) -> tuple[Transformer, Path]:
    root = tmp_path_factory.mktemp("export")
    net = random_backbone(tokenizer.vocab_size)
    model_dir = save_ar(root / "ar", net, tokenizer_file, tokenizer.mask_id)
    return net, export_hf(model_dir, root / "hf")


# ---------------------------------------------------------------------------------------------
# export


def test_export_writes_a_complete_llama_directory(
    exported: tuple[Transformer, Path], tokenizer: Tokenizer
) -> None:
    net, out = exported
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    } <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["intermediate_size"], config["head_dim"]) == (
        128,
        256,
        64,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)
    assert config["max_position_embeddings"] == 64 and config["rope_theta"] == 5000.0
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert config["vocab_size"] == tokenizer.vocab_size
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_embeddings": True},
        {"qk_norm": True, "d_model": 96, "head_dim_override": 64},
        {"attention_bias": True, "mlp_bias": True, "n_head": 4, "n_kv_head": 4},
        {"qk_norm": True, "attention_bias": True},
    ],
    ids=["llama", "tied", "qwen3-style", "llama-biases", "qwen3-attention-bias"],
)
def test_exported_logits_match_transformers(
    overrides: dict[str, Any],
    tmp_path: Path,
    tokenizer_file: Path,
    tokenizer: Tokenizer,
    single_thread: None,
) -> None:
    net = random_backbone(tokenizer.vocab_size, seed=1, **overrides)
    out = export_hf(
        save_ar(tmp_path / "ar", net, tokenizer_file, tokenizer.mask_id), tmp_path / "hf"
    )
    reference = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(
        0, tokenizer.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        expected = reference(ids).logits
    diff = (causal_logits(net, ids) - expected).abs().max().item()
    assert diff < ATOL, f"max logit diff {diff:.3g}"


@pytest.mark.parametrize("eos", [True, False], ids=["stop-at-eos", "no-eos"])
def test_greedy_tokens_match_hf_generate(
    exported: tuple[Transformer, Path], tokenizer: Tokenizer, eos: bool, single_thread: None
) -> None:
    net, out = exported
    eos_id = tokenizer.eos_id if eos else None
    paradigm = make_paradigm("ar", mask_id=tokenizer.mask_id)
    model = load_hf_model(out)
    for text in ("hello", "the quick", "z"):
        prompt = [tokenizer.bos_id, *tokenizer.encode(text)]
        ours = setdiff.generate(
            net, prompt, max_new_tokens=24, paradigm=paradigm, stop_ids=[eos_id] if eos else []
        )
        theirs = hf_generate(model, prompt, max_new_tokens=24, eos_id=eos_id)
        assert theirs["tokens"] == ours.tokens
        assert theirs["stopped"] == ours.stopped
        assert theirs["n_new_tokens"] == len(ours.tokens) and theirs["seconds"] > 0
    assert not eos or ours.tokens  # the sharpened model decodes something either way


@pytest.mark.parametrize("eos", [True, False], ids=["stop-at-eos", "no-eos"])
def test_batched_hf_generate_rows_equal_batch_1(
    exported: tuple[Transformer, Path], tokenizer: Tokenizer, eos: bool, single_thread: None
) -> None:
    """Left-padded prompts of different lengths and budgets: each row is its batch-1 decode."""
    _, out = exported
    eos_id = tokenizer.eos_id if eos else None
    model = load_hf_model(out)
    prompts = [[tokenizer.bos_id, *tokenizer.encode(t)] for t in ("hello", "the quick", "z")]
    budgets = [24, 10, 17]
    batch = hf_generate_batch(model, prompts, budgets, eos_id)
    alone = [
        hf_generate(model, p, n, eos_id)["tokens"] for p, n in zip(prompts, budgets, strict=True)
    ]
    assert batch["tokens"] == alone and batch["seconds"] > 0
    assert [len(t) for t in alone] != [len(t) for t in alone][:1] * 3  # rows end differently
    assert batch["forwards"] == max(len(t) for t in alone)  # one per column, until all stop
    with pytest.raises(ValueError, match="non-empty"):
        hf_generate_batch(model, [[1], []], [2, 2], eos_id)


def test_hf_generate_loads_a_directory(exported: tuple[Transformer, Path]) -> None:
    _, out = exported
    result = hf_generate(out, [1, 5, 6], max_new_tokens=4, eos_id=None)
    assert result["n_new_tokens"] == 4 and result["device"] == "cpu"
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf_generate(out, [1], max_new_tokens=0, eos_id=None)


def test_exported_tokenizer_round_trips(
    exported: tuple[Transformer, Path], tokenizer: Tokenizer
) -> None:
    _, out = exported
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = hf_tokenizer(text, add_special_tokens=False).input_ids
        assert ids == tokenizer.encode(text)
        assert hf_tokenizer.decode(ids) == text
    special = (
        hf_tokenizer.pad_token_id,
        hf_tokenizer.bos_token_id,
        hf_tokenizer.eos_token_id,
        hf_tokenizer.mask_token_id,
    )
    assert special == (0, 1, 2, 3)
    assert hf_tokenizer.model_max_length == 64


def test_export_refuses_non_ar_models(
    tmp_path: Path, tokenizer_file: Path, tokenizer: Tokenizer
) -> None:
    net = random_backbone(tokenizer.vocab_size)
    model_dir = tmp_path / "setdlm"
    save_model_dir(
        model_dir, net, make_paradigm("setdlm", mask_id=3), tokenizer_file=tokenizer_file
    )
    with pytest.raises(ValueError, match="only 'ar' models"):
        export_hf(model_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_cli_and_round_trip_through_load_hf_backbone(
    exported: tuple[Transformer, Path], tmp_path: Path
) -> None:
    net, out = exported
    model_dir = tmp_path / "again"
    assert hf.main(["export", str(out.parent / "ar"), str(model_dir)]) == 0
    back, raw = load_hf_backbone(model_dir)
    assert raw["model_type"] == "llama" and back.config == net.config
    for key, value in net.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key


def _export_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    """``python -m setdiff.hf`` with `argv`: its exit status and stderr."""
    capsys.readouterr()
    try:
        code = hf.main([str(a) for a in argv])
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    return code, capsys.readouterr().err


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def models(tmp_path: Path, tokenizer_file: Path, tokenizer: Tokenizer) -> Path:
    """A task's models folder as the pipeline writes it: models/arith/{ar,setdlm}."""
    net = random_backbone(tokenizer.vocab_size)
    save_ar(tmp_path / "models/arith/ar", net, tokenizer_file, tokenizer.mask_id)
    save_model_dir(
        tmp_path / "models/arith/setdlm",
        net,
        make_paradigm("setdlm", mask_id=tokenizer.mask_id),
        tokenizer_file=tokenizer_file,
    )
    return tmp_path / "models"


@pytest.mark.parametrize(
    ("out", "why"),
    [
        ("arith", "holds the model directory .*arith/ar"),
        ("arith/ar", "is the model directory"),
        ("arith/ar/hf", "is inside the model directory"),
        ("arith/setdlm", "is a model directory of the pipeline"),
        (".", r"holds \['arith', 'notes', 'tokenizer'\]"),
        ("notes", r"holds \['notes.txt'\]"),
        ("tokenizer", r"holds \['tokenizer.json'\] but no generation_config.json"),
    ],
)
def test_export_refuses_an_out_folder_it_would_damage(
    models: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    out: str,
    why: str,
) -> None:
    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    (models / "notes").mkdir()
    (models / "notes/notes.txt").write_text("mine")
    (models / "tokenizer").mkdir()  # as a task's data/<task>/tokenizer/ folder
    (models / "tokenizer/tokenizer.json").write_bytes(
        (models / "arith/ar/tokenizer.json").read_bytes()
    )
    before = _tree(models.parent)
    code, err = _export_cli(capsys, "export", models / "arith/ar", models / out)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert re.search(f"{re.escape(str(models / out))}: refused .*{why}", err), err
    assert _tree(models.parent) == before  # nothing written, nothing removed


def test_export_writes_into_a_new_folder_and_over_an_earlier_export(
    models: Path, tmp_path: Path
) -> None:
    out = tmp_path / "served/ar-hf"
    (tmp_path / "served").mkdir()
    (tmp_path / "served/other.txt").write_text("kept")
    assert hf.main(["export", str(models / "arith/ar"), str(out)]) == 0
    first = _tree(out)
    assert set(first) == set(hf.EXPORT_FILES)
    assert hf.main(["export", str(models / "arith/ar"), str(out)]) == 0  # again, over it
    assert _tree(out) == first
    assert (tmp_path / "served/other.txt").read_text() == "kept"
    assert sorted(p.name for p in (tmp_path / "served").iterdir()) == ["ar-hf", "other.txt"]


@pytest.mark.parametrize("earlier", [False, True], ids=["new-folder", "over-an-export"])
def test_a_full_disk_during_export_is_one_line_naming_the_file(
    models: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    earlier: bool,
) -> None:
    from safetensors import SafetensorError

    monkeypatch.delenv("SETDIFF_DEBUG", raising=False)
    out = tmp_path / "ar-hf"
    if earlier:
        export_hf(models / "arith/ar", out)

    def full(*args: object, **kwargs: object) -> None:  # what safetensors raises on ENOSPC
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr("setdiff.hf.save_file", full)
    code, err = _export_cli(capsys, "export", models / "arith/ar", out)
    assert code == 2 and err.count("\n") == 1
    assert "no space left on device" in err and str(out / "model.safetensors") in err
    if earlier:  # the folder stays, but no longer loads as a model
        assert out.is_dir() and not (out / "config.json").exists()
    else:  # the folder the export created is gone
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    monkeypatch.undo()  # disk space again: the export goes through, over what was left
    assert export_hf(models / "arith/ar", out) == out and (out / "config.json").exists()


# ---------------------------------------------------------------------------------------------
# import


def _randomise(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.05 * noise)


def _hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


LLAMA = dict(
    vocab_size=48,
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    rope_theta=20000.0,
    rms_norm_eps=1e-5,
)
QWEN3 = dict(LLAMA, hidden_size=96, head_dim=64, rope_theta=1e6, tie_word_embeddings=True)


@pytest.mark.parametrize(
    "config_cls, model_cls, kwargs, shard",
    [
        (LlamaConfig, LlamaForCausalLM, LLAMA, None),
        (LlamaConfig, LlamaForCausalLM, LLAMA, "60KB"),
        (Qwen3Config, Qwen3ForCausalLM, QWEN3, None),
    ],
    ids=["llama", "llama-sharded", "qwen3"],
)
def test_load_hf_backbone_matches_transformers_logits(
    config_cls: Any, model_cls: Any, kwargs: dict, shard: str | None, tmp_path: Path,
    single_thread: None,
) -> None:  # fmt: skip
    reference = model_cls(config_cls(**kwargs)).eval()
    _randomise(reference, seed=0)
    save = {"max_shard_size": shard} if shard else {}
    reference.save_pretrained(tmp_path, **save)
    assert (tmp_path / hf.INDEX_FILE).exists() == (shard is not None)
    net, raw = load_hf_backbone(tmp_path)
    assert raw["model_type"] == config_cls.model_type
    is_qwen = config_cls is Qwen3Config
    assert net.config.qk_norm == is_qwen and net.config.head_dim == 64
    assert net.config.tie_embeddings == is_qwen
    ids = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(1))
    diff = (causal_logits(net, ids) - _hf_logits(reference, ids)).abs().max().item()
    assert diff < ATOL, f"max logit diff {diff:.3g}"


BASE = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rope_parameters"),
        ({"model_type": "qwen3", "mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"sliding_window": 4096}, "sliding_window"),
        ({"model_type": "qwen3", "use_sliding_window": True}, "use_sliding_window"),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"intermediate_size": None}, "intermediate_size"),
    ],
)
def test_unsupported_config_fields_are_named(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        model_config_from_hf({**BASE, **change})


def test_biases_are_read_from_llama_configs() -> None:
    config = model_config_from_hf({**BASE, "attention_bias": True, "mlp_bias": True})
    assert config.attention_bias and config.mlp_bias


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"norm": "layer"}, "norm"),
        ({"mlp": "gelu"}, "mlp"),
        ({"learned_positions": True}, "learned"),
    ],
)
def test_export_refuses_backbones_without_an_hf_counterpart(
    overrides: dict[str, Any],
    field: str,
    tmp_path: Path,
    tokenizer_file: Path,
    tokenizer: Tokenizer,
) -> None:
    net = random_backbone(tokenizer.vocab_size, **overrides)
    model_dir = save_ar(tmp_path / "ar", net, tokenizer_file, tokenizer.mask_id)
    with pytest.raises(ValueError, match=f"model.{field}"):
        export_hf(model_dir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_config_defaults_follow_transformers() -> None:
    llama = model_config_from_hf(BASE)
    assert (llama.head_dim, llama.n_kv_head, llama.rope_theta) == (64, 2, 10000.0)
    assert llama.head_dim_override is None and not llama.qk_norm
    qwen = model_config_from_hf({**BASE, "model_type": "qwen3", "sliding_window": 4096})
    assert qwen.head_dim == 128 and qwen.head_dim_override == 128 and qwen.qk_norm
    legacy = model_config_from_hf({**BASE, "rope_theta": 5e5, "rope_scaling": None})
    assert legacy.rope_theta == 5e5


def test_unsupported_checkpoint_is_refused_by_load(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act"):
        load_hf_backbone(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(ValueError, match="only safetensors"):
        load_hf_backbone(tmp_path)


def test_hub_ids_go_through_snapshot_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    reference = LlamaForCausalLM(LlamaConfig(**LLAMA))
    reference.save_pretrained(tmp_path / "snapshot")
    calls = []

    def fake_download(repo_id: str, **kwargs: Any) -> str:
        calls.append(repo_id)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    net, _ = load_hf_backbone("someone/tiny-llama")
    assert calls == ["someone/tiny-llama"] and net.config.vocab_size == 48
    with pytest.raises(FileNotFoundError):
        load_hf_backbone(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------------------------
# mask token


def test_choose_mask_id(tokenizer: Tokenizer) -> None:
    vocab = {"a": 0, "<mask>": 5, "<|fim_middle|>": 9}
    assert choose_mask_id(vocab) == 9
    assert choose_mask_id(vocab, preferred=("[MASK]", "<mask>")) == 5
    assert choose_mask_id(tokenizer) == tokenizer.mask_id
    assert choose_mask_id(tokenizer.backend) == tokenizer.mask_id
    with pytest.raises(ValueError, match="none of"):
        choose_mask_id({"a": 0})


def test_load_in_bfloat16_keeps_rope_in_float32(tmp_path: Path) -> None:
    LlamaForCausalLM(LlamaConfig(**LLAMA)).save_pretrained(tmp_path)
    net, _ = load_hf_backbone(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    assert net.inv_freq.dtype == torch.float32
