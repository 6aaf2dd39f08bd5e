"""Speculative AR decoding (``generate(ar, ..., draft=small_ar, draft_tokens=k)``): exactly the
AR greedy decode, cached and recomputed, whatever the draft proposes: a random draft (mostly
rejected), the main model itself (everything accepted: k + 1 tokens a forward), drafts that
never agree; stops fire on verified tokens; bad arguments are refused before any compute."""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from setdiff.artifacts import save_model_dir
from setdiff.baselines.hf_engine import hf_generate, load_hf_model
from setdiff.hf import export_hf
from setdiff.model import Transformer
from setdiff.paradigm import Paradigm, SetDLMConfig, make_paradigm
from setdiff.sampling import draft_model, static
from setdiff.sampling.draft_model import DraftModel
from setdiff.sampling.loop import GenerateResult, generate, generate_batch
from setdiff.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from conftest import build_tiny_model  # noqa: E402
from decode_checks import assert_same_decode

pytestmark = pytest.mark.usefixtures("single_thread")

MASK_ID = 3
VOCAB = 24
AR = make_paradigm("ar", mask_id=MASK_ID)
PROMPTS = [[1], [1, 5, 7], [1, 5, 7, 9, 11, 13, 15]]
N = 12


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A `Decodable` (as `setdiff.artifacts.LoadedModel` is one)."""

    net: Transformer
    paradigm: Paradigm
    tokenizer: None = None


@pytest.fixture(params=[(0, 1.0), (1, 20.0)], ids=["s0", "s1-sharp"])
def net(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Transformer]) -> Transformer:
    seed, head_scale = request.param
    return make_tiny_model(seed=seed, head_scale=head_scale)


def _noisy(net: Transformer, scale: float) -> Transformer:
    """`net` with noise on its output head: a draft that agrees often, not always."""
    noisy = Transformer(net.config).float().eval()
    noisy.load_state_dict(net.state_dict())
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        w = noisy.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=gen))
    return noisy


def _drafts(net: Transformer, make_tiny_model: Callable[..., Transformer]) -> dict[str, Any]:
    return {
        "random": make_tiny_model(seed=5, n_layer=1, d_model=16, d_ff=32),
        "noisy": _noisy(net, 1.0),
        "self": Loaded(net, AR),
    }


def _greedy(net: Transformer, prompt: list[int], **kw: Any) -> GenerateResult:
    return generate(net, prompt, paradigm=AR, **{"max_new_tokens": N, **kw})


def _spec(net: Transformer, prompt: list[int], draft: Any, k: int, **kw: Any) -> GenerateResult:
    """Speculative decoding, cached and recomputed: same tokens, steps, NFE, drafts; logits to
    1e-5 (so the cache holds exactly the verified tokens' K/V, none of a rejected draft's)."""
    run = dict(max_new_tokens=N, paradigm=AR, draft=draft, draft_tokens=k, trace_logits=True)
    a = generate(net, prompt, **run, **kw)
    b = generate(net, prompt, use_cache=False, **run, **kw)
    assert_same_decode(b, a, same_cache=False)
    decoded = [p for step in a.steps for p in step]  # each position once, left to right
    assert decoded == list(range(len(prompt), len(prompt) + len(decoded)))
    assert len(decoded) >= len(a.tokens)
    assert a.draft_nfe > 0 and a.drafts[1] <= a.drafts[0]
    return a


@pytest.mark.parametrize("kind", ["random", "noisy", "self"])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_speculative_ar_is_the_greedy_decode(
    net: Transformer,
    make_tiny_model: Callable[..., Transformer],
    prompt: list[int],
    k: int,
    kind: str,
) -> None:
    draft = _drafts(net, make_tiny_model)[kind]
    out = _spec(net, prompt, draft, k)
    assert out.tokens == _greedy(net, prompt).tokens
    assert not out.stopped and out.nfe <= N


def test_the_drafts_are_partly_accepted(
    net: Transformer, make_tiny_model: Callable[..., Transformer]
) -> None:
    """The noisy draft exercises both branches of the accept rule (and the draft cache's
    rollback): some drafts agree, some do not."""
    checked = accepted = 0
    for prompt in PROMPTS:
        out = _spec(net, prompt, _drafts(net, make_tiny_model)["noisy"], 3)
        checked, accepted = checked + out.drafts[0], accepted + out.drafts[1]
    assert 0 < accepted < checked


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_self_draft_decodes_k_plus_one_tokens_a_forward(
    net: Transformer, prompt: list[int], k: int
) -> None:
    """The main model as its own draft: every draft agrees, so each forward after the prefill
    verifies its k drafts plus the bonus token (the last forward: what is left)."""
    out = _spec(net, prompt, Loaded(net, AR), k)
    assert out.tokens == _greedy(net, prompt).tokens
    assert out.drafts[0] == out.drafts[1] > 0
    assert [len(s) for s in out.steps] == [1] + [k + 1] * ((N - 1) // (k + 1)) + (
        [(N - 1) % (k + 1)] if (N - 1) % (k + 1) else []
    )
    assert out.nfe == 1 + -(-(N - 1) // (k + 1))
    assert out.draft_nfe == out.drafts[0]  # the self-draft feeds one token a draft


@pytest.mark.parametrize("kind", ["random", "noisy", "self"])
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[2]], ids=len)
def test_static_step(
    monkeypatch: pytest.MonkeyPatch,
    net: Transformer,
    make_tiny_model: Callable[..., Transformer],
    prompt: list[int],
    kind: str,
) -> None:
    """compile_step's static shape (`max_step` = k + 1 inputs: the last verified token and the
    drafts), the compiler replaced by the eager model: the eager decode, rejected entries
    cropped from the static cache."""
    monkeypatch.setattr(static, "compiled_forward", static.greedy_forward)
    run = dict(draft=_drafts(net, make_tiny_model)[kind], draft_tokens=3, trace_logits=True)
    eager = _greedy(net, prompt, **run)
    compiled = _greedy(net, prompt, compile_step=True, **run)
    assert_same_decode(compiled, eager)
    assert compiled.tokens == _greedy(net, prompt).tokens


def _wrong(token: int) -> int:
    return (token + 1) % VOCAB or 4  # never the token, never [MASK] (3)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("prompt", PROMPTS, ids=len)
def test_wrong_drafts_still_decode_exactly(
    net: Transformer, monkeypatch: pytest.MonkeyPatch, prompt: list[int], k: int
) -> None:
    """Drafts that never agree: each is rejected (its K/V dropped), one token a forward."""
    ref = torch.tensor(prompt + _greedy(net, prompt).tokens)

    def propose(self: DraftModel, prefix: list[int], n: int) -> list[int]:
        return [_wrong(int(t)) for t in ref[len(prefix) : len(prefix) + n]]

    monkeypatch.setattr(draft_model.DraftModel, "propose", propose)
    out = generate(net, prompt, paradigm=AR, max_new_tokens=N, draft=net, draft_tokens=k)
    rec = generate(
        net, prompt, paradigm=AR, max_new_tokens=N, draft=net, draft_tokens=k, use_cache=False
    )
    assert out.tokens == rec.tokens == ref[len(prompt) :].tolist()
    assert all(len(s) == 1 for s in out.steps) and out.nfe == N
    assert out.drafts[0] > 0 and out.drafts[1] == 0


@pytest.mark.parametrize("kind", ["random", "self"])
def test_stops_fire_on_verified_tokens(
    net: Transformer, make_tiny_model: Callable[..., Transformer], kind: str
) -> None:
    """A stop fires once verified, where greedy AR stops (later tokens of that forward cut)."""
    prompt = PROMPTS[1]
    stop = _greedy(net, prompt).tokens[N // 2]
    expected = _greedy(net, prompt, stop_ids=[stop])
    assert expected.stopped
    out = _spec(net, prompt, _drafts(net, make_tiny_model)[kind], 4, stop_ids=[stop])
    assert out.stopped and out.tokens == expected.tokens


def test_the_draft_cache_rolls_back_to_the_accepted_prefix(
    make_tiny_model: Callable[..., Transformer],
) -> None:
    """After proposing on one prefix, a proposal on another (sharing some of it) equals a
    fresh draft model's, and so does its cache: the K/V of tokens no longer in the prefix are
    dropped."""
    net = make_tiny_model(seed=1, head_scale=20.0)
    used = DraftModel(net, 64, MASK_ID)
    d0, d1 = used.propose([1, 5, 7], 4)[:2]
    prefixes = [[1, 5, 7, d0, _wrong(d1)], [1, 5, 8], [1, 5, 8, 9], [1, 6, 8, 9, 2], [2, 5, 8, 9]]
    for prefix in prefixes:
        fresh = DraftModel(net, 64, MASK_ID)
        assert used.propose(prefix, 3) == fresh.propose(prefix, 3)
        n = fresh.cache.length
        assert used.cache.length == n
        for a, b in (
            (used.cache.k_NBGCE, fresh.cache.k_NBGCE),
            (used.cache.v_NBGCE, fresh.cache.v_NBGCE),
        ):
            assert (a[..., :n, :] - b[..., :n, :]).abs().max().item() <= 1e-5


def _no_forward(*_: Any) -> None:
    raise AssertionError("a forward ran before the refusal")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"draft_tokens": 3, "temperature": 1.0}, "greedy: temperature must be 0"),
        ({"draft_tokens": 3, "vocab": 32}, "vocab_size 32, the model 24"),
        ({"draft_tokens": 3, "draft_paradigm": "setdlm"}, "draft must be an ar model"),
        ({"draft_tokens": 3, "draft": "small"}, "draft must be a LoadedModel or Transformer"),
        ({}, "draft needs draft_tokens=k"),
        ({"draft_tokens": 0}, "draft needs draft_tokens=k"),
        ({"draft_tokens": -1}, "draft_tokens must be an int >= 0"),
        ({"draft_tokens": 3, "no_draft": True}, "draft_tokens needs draft="),
        ({"draft_tokens": 3, "cache_size": 10}, r"needs cache_size >= 15"),
        ({"draft_tokens": 3, "max_seq_len": 8}, "draft: its max_seq_len=8"),
    ],
)
def test_refusals_before_compute(
    tiny_model: Transformer,
    make_tiny_model: Callable[..., Transformer],
    args: dict[str, Any],
    message: str,
) -> None:
    args = dict(args)
    overrides = {"vocab_size": args.pop("vocab", VOCAB), "max_seq_len": args.pop("max_seq_len", 64)}
    draft: Any = make_tiny_model(seed=5, **overrides)
    if (name := args.pop("draft_paradigm", None)) is not None:
        draft = Loaded(draft, make_paradigm(name, mask_id=MASK_ID))
    draft = args.pop("draft", draft)
    if args.pop("no_draft", False):
        draft = None
    for model in (tiny_model, draft):
        if isinstance(model, torch.nn.Module):
            model.register_forward_pre_hook(_no_forward)
    with pytest.raises(ValueError, match=message):
        generate(tiny_model, [1, 5, 7], paradigm=AR, max_new_tokens=N, draft=draft, **args)


def test_refused_for_other_paradigms_and_batches(tiny_model: Transformer) -> None:
    tiny_model.register_forward_pre_hook(_no_forward)
    setdlm = make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=MASK_ID)
    with pytest.raises(ValueError, match="needs an ar model, got a setdlm model"):
        generate(tiny_model, [1], paradigm=setdlm, max_new_tokens=N, draft=tiny_model)
    with pytest.raises(ValueError, match="batch size 1 only"):
        generate_batch(tiny_model, [[1], [1, 5]], paradigm=AR, max_new_tokens=N, draft_tokens=3)


# ---------------------------------------------------------------------------------------------
# transformers baselines: assisted generation and prompt lookup decoding


@dataclasses.dataclass(frozen=True)
class Exported:
    """Tiny AR models exported to HF directories (`setdiff.hf.export_hf`)."""

    net: Transformer
    draft: Transformer
    hf: Path
    hf_draft: Path
    eos_id: int
    paradigm: Paradigm


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("arspec")
    tokenizer_file = root / "tokenizer.json"
    texts = ["hello world", "the quick brown fox", "jumps over 12 lazy dogs\n"]
    train_tokenizer(texts, TokenizerConfig(kind="char", seq_len=32)).save(str(tokenizer_file))
    tokenizer = load_tokenizer(tokenizer_file)
    paradigm = make_paradigm("ar", mask_id=tokenizer.mask_id)

    def export(name: str, seed: int, **overrides: Any) -> tuple[Transformer, Path]:
        net = build_tiny_model(
            seed, 8.0, vocab_size=tokenizer.vocab_size, max_seq_len=64, **overrides
        )
        save_model_dir(root / name, net, paradigm, tokenizer_file=tokenizer_file)
        return net, export_hf(root / name, root / f"{name}-hf")

    (net, hf), (draft, hf_draft) = export("main", 0), export("draft", 5, n_layer=1, d_model=16)
    return Exported(net, draft, hf, hf_draft, tokenizer.eos_id, paradigm)


HF_PROMPTS = [[0], [0, 5, 6, 7], [0, 9, 10, 9, 10, 11]]
HF_N = 24


@pytest.mark.parametrize("eos", [False, True], ids=["no-eos", "eos"])
def test_hf_assisted_and_prompt_lookup_equal_greedy_and_ours(exported: Exported, eos: bool) -> None:
    """Plain greedy, assisted (a random draft; the model itself: k + 1 tokens a forward) and
    prompt lookup decoding with transformers, and our AR greedy and speculative decodes: the
    same tokens (with an EOS: the greedy decode's token at HF_N // 2, so that it fires); the
    speculative ones in fewer forwards of the model."""
    model, e = load_hf_model(exported.hf), exported
    drafts = {"random": load_hf_model(e.hf_draft), "self": load_hf_model(e.hf)}
    lookup_forwards = plain_forwards = 0
    for prompt in HF_PROMPTS:
        eos_id = hf_generate(model, prompt, HF_N, None)["tokens"][HF_N // 2] if eos else None
        plain = hf_generate(model, prompt, HF_N, eos_id)
        tokens, n = plain["tokens"], plain["n_new_tokens"]
        assert plain["forwards"] == n and plain["assistant_forwards"] == 0
        assert plain["stopped"] == eos
        ar = dict(paradigm=e.paradigm, max_new_tokens=HF_N, stop_ids=[eos_id] if eos else [])
        assert generate(e.net, prompt, **ar).tokens == tokens
        for draft in (e.draft, e.net):
            assert generate(e.net, prompt, draft=draft, draft_tokens=4, **ar).tokens == tokens
        for name, assistant in drafts.items():
            out = hf_generate(
                model, prompt, HF_N, eos_id, assistant_model=assistant, assistant_tokens=4
            )
            assert out["tokens"] == tokens, name
            assert 0 < out["forwards"] <= n and out["assistant_forwards"] > 0
            if name == "self" and n == HF_N:
                assert out["forwards"] <= 1 + -(-(n - 1) // 5)
                assert out["tokens_per_forward"] > 3
        lookup = hf_generate(model, prompt, HF_N, eos_id, prompt_lookup_num_tokens=3)
        assert lookup["tokens"] == tokens and 0 < lookup["forwards"] <= n
        lookup_forwards, plain_forwards = lookup_forwards + lookup["forwards"], plain_forwards + n
    assert eos or lookup_forwards < plain_forwards  # the greedy decodes repeat: lookups agree


def test_hf_speculative_refusals(exported: Exported) -> None:
    model = load_hf_model(exported.hf)
    model.register_forward_pre_hook(_no_forward)
    config = copy.deepcopy(model.config)
    config.vocab_size = 7
    other = AutoModelForCausalLM.from_config(config)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"assistant_model": model, "prompt_lookup_num_tokens": 3}, "choose one draft source"),
        ({"assistant_tokens": 3}, "assistant_tokens needs assistant_model"),
        ({"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens must be an int >= 1"),
        ({"assistant_model": model, "assistant_tokens": True}, "assistant_tokens must be an int"),
        ({"assistant_model": other}, "assistant_model has vocab_size 7"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            hf_generate(model, [0, 5], HF_N, None, **kwargs)
