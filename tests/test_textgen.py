"""Text quality: sample statistics, the AR judge, infilling protocols and the textgen stage."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from setdiff import textgen
from setdiff.artifacts import LoadedModel, save_model_dir
from setdiff.masks import causal_mask
from setdiff.measure import COLUMNS
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.sampling.loop import GenerateResult, generate
from setdiff.stages import textgen as stage
from setdiff.tasks.records import to_jsonl
from setdiff.textgen import (
    distinct_n,
    infill,
    infill_examples,
    judge_nll,
    repetition_rate,
    rouge_l,
    token_nll,
    unconditional,
    unigram_entropy,
    with_sampling,
)
from setdiff.tokenizer import Tokenizer, TokenizerConfig, train_tokenizer

CHAPTERS = [
    ["Let there be light.", "And there was light.", "It was good.", "The first day.", "Amen."],
    ["Jesus wept.", "Rejoice evermore.", "Pray always.", "Give thanks.", "Hold fast."],
    ["He rose up.", "He went down.", "The sea was calm.", "They cried out.", "God heard."],
]
VERSES = [
    {"book": "Test", "chapter": c + 1, "verse": v + 1, "text": text}
    for c, chapter in enumerate(CHAPTERS)
    for v, text in enumerate(chapter)
]
MAX_LEN = 64


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    texts = [v["text"] + "\n" for v in VERSES]
    return Tokenizer(
        train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=300, seq_len=64))
    )


def tiny_model(tokenizer: Tokenizer, paradigm: str, seed: int = 0) -> LoadedModel:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        n_layer=1,
        n_head=1,
        n_kv_head=1,
        d_model=32,
        d_ff=64,
        max_seq_len=MAX_LEN,
    )
    net = Transformer(config).float().eval()
    with torch.no_grad():  # spread the confidences of an untrained model
        net.lm_head.weight.mul_(20.0)
    return LoadedModel(
        net, make_paradigm(paradigm, mask_id=tokenizer.mask_id), tokenizer, Path(paradigm)
    )


# ---------------------------------------------------------------------------------------------
# statistics


def test_unigram_entropy_hand_computed() -> None:
    assert unigram_entropy([7, 7, 7]) == 0.0
    assert unigram_entropy([1, 1, 2, 2]) == pytest.approx(math.log(2))
    assert unigram_entropy([1, 2, 3, 1]) == pytest.approx(1.5 * math.log(2))
    assert math.isnan(unigram_entropy([]))


def test_distinct_n_and_repetition_hand_computed() -> None:
    samples = [[1, 2, 1, 2], [1, 2]]
    assert distinct_n(samples, 1) == pytest.approx(2 / 6)
    assert distinct_n(samples, 2) == pytest.approx(2 / 4)  # (1,2) (2,1) (1,2) | (1,2)
    assert distinct_n(samples, 3) == pytest.approx(2 / 2)  # none spans two samples
    assert math.isnan(distinct_n([[1]], 2))
    assert repetition_rate([[1, 2, 1, 2]], 2) == pytest.approx(1 / 3)
    assert repetition_rate([[1, 2, 3]], 2) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        distinct_n(samples, 0)


def test_judge_nll_is_the_hand_computed_cross_entropy(tokenizer: Tokenizer) -> None:
    judge = tiny_model(tokenizer, "ar")
    samples = [[5, 9, 40, 7], [11], []]
    got = judge_nll(judge, samples, tokenizer.bos_id)
    for sample, value in zip(samples[:2], got[:2], strict=True):
        ids = [tokenizer.bos_id, *sample]
        nll = []
        for k in range(1, len(ids)):  # prefix by prefix: an independent route to the same NLL
            prefix = torch.tensor(ids[:k])
            logits = judge.net(prefix[None], torch.arange(k)[None], causal_mask(k))[0, -1]
            nll.append(-torch.log_softmax(logits.double(), -1)[ids[k]].item())
        assert value == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert math.isnan(got[2])
    long = [list(range(5, 5 + 2 * MAX_LEN))]
    assert token_nll(judge, long, tokenizer.bos_id)[0].shape == (MAX_LEN - 1,)
    assert textgen.generative_perplexity(token_nll(judge, samples, tokenizer.bos_id)) > 1
    assert math.isnan(textgen.generative_perplexity(token_nll(judge, [[]], tokenizer.bos_id)))
    with pytest.raises(ValueError, match="judge must be an ar"):
        judge_nll(tiny_model(tokenizer, "setdlm"), samples, tokenizer.bos_id)


def test_rouge_l_sanity() -> None:
    assert rouge_l("and there was light", "and there was light") == pytest.approx(1.0)
    assert rouge_l("jesus wept", "pray always") == 0.0
    assert 0.0 < rouge_l("and there was darkness", "and there was light") < 1.0
    assert rouge_l("", "and there was light") == 0.0


# ---------------------------------------------------------------------------------------------
# infilling


def test_infill_examples_are_deterministic_consecutive_and_fit(tokenizer: Tokenizer) -> None:
    a = infill_examples(VERSES, tokenizer, 6, seed=3, max_len=MAX_LEN)
    assert a == infill_examples(VERSES, tokenizer, 6, seed=3, max_len=MAX_LEN)
    assert len(a) == 6 and len({e.source for e in a}) == 6
    by_source = {f"{v['book']} {v['chapter']}:{v['verse']}": v for v in VERSES}
    for e in a:
        assert 1 + len(e.left) + len(e.middle) + len(e.right) <= MAX_LEN
        mid = by_source[e.source]
        assert e.reference == mid["text"]
        assert tokenizer.decode(e.middle) == mid["text"] + "\n"
        chapter = CHAPTERS[mid["chapter"] - 1]
        assert tokenizer.decode(e.left) == chapter[mid["verse"] - 2] + "\n"
        assert tokenizer.decode(e.right) == chapter[mid["verse"]]
    # 3 chapters x 3 triples; a verse never borrows context from another chapter
    assert len(infill_examples(VERSES, tokenizer, 9, seed=0, max_len=MAX_LEN)) == 9
    with pytest.raises(ValueError, match="only 9 of 9"):
        infill_examples(VERSES, tokenizer, 10, seed=0, max_len=MAX_LEN)
    short = infill_examples(VERSES, tokenizer, 9, seed=0, max_len=MAX_LEN, context_tokens=2)
    assert all(len(e.left) <= 2 and len(e.right) <= 2 for e in short)
    assert len(infill_examples(VERSES, tokenizer, 0, seed=0, max_len=12, context_tokens=1)) == 0


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []

    def spy(model, prompt, **kwargs):  # type: ignore[no-untyped-def]
        calls.append({"prompt": list(prompt), **kwargs})
        return generate(model, prompt, **kwargs)

    monkeypatch.setattr(textgen, "generate", spy)
    return calls


def test_setdlm_infill_sees_the_right_context(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(tokenizer, "setdlm")
    example = infill_examples(VERSES, tokenizer, 1, seed=0, max_len=MAX_LEN)[0]
    calls = _spy(monkeypatch)
    result = infill(model, example, decode_options={"window": 4})
    assert result.uses_right_context
    assert calls[0]["suffix_ids"] == example.right
    assert len(result.generation.tokens) == len(example.middle)
    prompt = [tokenizer.bos_id, *example.left]
    assert result.prompt_tokens == len(prompt) + len(example.right)
    # the suffix is prefilled into the cache, and it changes what the queries see
    assert result.generation.cache_length >= len(prompt) + len(example.right)
    n = len(example.middle)
    with_right = generate(
        model, prompt, max_new_tokens=n, suffix_ids=example.right, window=4, trace_logits=True
    )
    without = generate(model, prompt, max_new_tokens=n, window=4, trace_logits=True)
    assert not torch.allclose(with_right.logits[1][-4:], without.logits[1][-4:])
    assert 0.0 <= result.rouge_l <= 1.0 and result.exact in (0.0, 1.0)


@pytest.mark.parametrize("paradigm", ["ar", "bd3lm"])
def test_left_only_protocol_generates_exactly_the_middle_length(
    paradigm: str, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(tokenizer, paradigm)
    calls = _spy(monkeypatch)
    for example in infill_examples(VERSES, tokenizer, 3, seed=1, max_len=MAX_LEN):
        result = infill(model, example, decode_options={})
        assert not result.uses_right_context
        assert calls[-1]["suffix_ids"] is None and not calls[-1].get("stop_ids")
        assert len(result.generation.tokens) == len(example.middle)
        assert result.prompt_tokens == 1 + len(example.left)


# ---------------------------------------------------------------------------------------------
# unconditional


@pytest.mark.parametrize("paradigm", sorted(PARADIGMS))
def test_with_sampling_sets_temperature_and_top_p(paradigm: str, tokenizer: Tokenizer) -> None:
    model = tiny_model(tokenizer, paradigm)
    base = {"window": 4} if paradigm == "setdlm" else {}
    options = with_sampling(model, base, temperature=0.8, top_p=0.9)
    assert options == {**base, "temperature": 0.8, "top_p": 0.9}


def test_unconditional_samples_stop_at_eos(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(tokenizer, "setdlm")
    samples = unconditional(
        model, n_samples=2, max_new_tokens=12, seed=0, decode_options={"temperature": 1.0}
    )
    assert [len(s.generation.tokens) <= 12 for s in samples] == [True, True]
    assert samples[0].generation.tokens != samples[1].generation.tokens  # seeds 0 and 1
    stopped = GenerateResult(tokens=[7, 8, tokenizer.eos_id], nfe=3, steps=[], stopped=True,
                             forward_seconds=0.0)  # fmt: skip
    monkeypatch.setattr(textgen, "generate", lambda *a, **k: stopped)
    sample = unconditional(model, n_samples=1, max_new_tokens=12, seed=0, decode_options={})[0]
    assert sample.tokens == [7, 8] and sample.new_tokens == 3


# ---------------------------------------------------------------------------------------------
# the stage


def _write_repo(root: Path, tokenizer: Tokenizer) -> Path:
    tokenizer.save(root / "tokenizer.json")
    for paradigm in ("ar", "setdlm"):
        model = tiny_model(tokenizer, paradigm, seed=1)
        save_model_dir(
            root / "models" / "text" / paradigm,
            model.net,
            model.paradigm,
            tokenizer_file=root / "tokenizer.json",
        )
    raw = root / "data" / "text" / "raw"
    raw.mkdir(parents=True)
    (raw / "test.jsonl").write_bytes(to_jsonl(VERSES))
    params = {
        "textgen": {
            "n_infill": 3,
            "infill_context": 0,
            "n_uncond": 2,
            "uncond_tokens": 16,
            "seed": 0,
            "temperature": 1.0,
            "top_p": 0.95,
            "warmup": 1,
            "device": "cpu",
            "threads": 1,
        },
        "decode": {"ar": {}, "setdlm": {"window": 4}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"


def test_stage_writes_rows_and_metrics(tmp_path: Path, tokenizer: Tokenizer) -> None:
    params = _write_repo(tmp_path, tokenizer)
    for paradigm in ("setdlm", "ar"):
        stage.main(
            ["--task", "text", "--paradigm", paradigm, "--root", str(tmp_path),
             "--params", str(params)]
        )  # fmt: skip
        with open(tmp_path / "results" / "textgen" / "text" / f"{paradigm}.csv") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
        assert reader.fieldnames == COLUMNS
        assert [r["config"] for r in rows] == ["infill"] * 3 + ["uncond"] * 2
        assert {r["paradigm"] for r in rows} == {paradigm}
        assert all(r["exact"] == "nan" for r in rows if r["config"] == "uncond")
        metrics = json.loads(
            (tmp_path / "metrics" / "textgen" / "text" / f"{paradigm}.json").read_text()
        )
        assert metrics["uses_right_context"] is (paradigm == "setdlm")
        assert metrics["uncond_decode_options"]["top_p"] == 0.95
        for key in (
            "infill_rouge_l", "infill_exact", "infill_judge_nll", "infill_judge_nll_reference",
            "uncond_gen_ppl", "uncond_unigram_entropy", "uncond_distinct_1",
            "uncond_distinct_2", "uncond_distinct_3", "uncond_mean_length",
            "uncond_tokens_per_second", "uncond_tokens_per_forward", "fingerprint",
        ):  # fmt: skip
            assert key in metrics, key
        assert metrics["n_infill"] == 3 and metrics["n_uncond"] == 2
        assert metrics["uncond_gen_ppl"] > 1


def test_stage_config_validation() -> None:
    with pytest.raises(ValueError, match="top_p"):
        stage.TextGenConfig(top_p=0.0)
    with pytest.raises(ValueError, match="n_infill"):
        stage.TextGenConfig(n_infill=0)
