"""Lossless decoders side by side at batch 1: AR greedy, AR with speculative decoding, and
self-speculative set decoding, each against the greedy decode it must reproduce (the
``lossless`` stage, `setdiff.stages.lossless`, runs it on a run's models).

Methods (each decodes every prompt once, interleaved per example, after an unrecorded warm-up
prompt; wall time per example with the prefill, `setdiff.measure.timed`):
- ``ar``: our AR model, greedy (the reference of every AR method);
- ``ar+draft k=K``: our engine, a draft model (a small AR model of the same vocabulary, trained
  by the stage) proposing K tokens that one forward of the AR model checks
  (``generate(draft=, draft_tokens=)``);
- ``hf``, ``hf+assisted k=K``, ``hf+lookup k=K`` (`LosslessConfig.transformers`): the AR model
  exported to Hugging Face, ``generate`` plain, with the exported draft as ``assistant_model``,
  and with prompt lookup decoding;
- ``setdlm W=1`` (the reference of verify) and ``setdlm verify W=W``.
Per method: accuracy (exact match), tokens/s, tokens per forward of the verifying model, the
drafts' acceptance rate, the rows identical to the method's reference (n/N), and tokens/s over
AR's, and over the fastest AR + speculative method's, each with a paired 95% bootstrap CI over
examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from setdiff.config import ConfigError, check, frozen
from setdiff.measure import count_new_tokens, timed
from setdiff.paradigm import make_paradigm
from setdiff.progress import progress_bar
from setdiff.sampling.loop import generate
from setdiff.sampling.policies import decode_policy
from setdiff.tradeoff import bootstrap, group, summarize
from setdiff.train import TrainConfig


@frozen
class DraftModelConfig:
    """The draft's architecture (vocabulary and context are the task's, as the AR model's)."""

    n_layer: int = 1
    d_model: int = 64
    n_head: int = 2
    d_ff: int = 128

    def __post_init__(self) -> None:
        check(self.n_layer >= 1 and self.d_model >= 1, "n_layer and d_model must be >= 1")
        check(self.d_model % self.n_head == 0, "d_model must be a multiple of n_head")


@frozen
class LosslessConfig:
    """``lossless``: the draft model the stage trains and the lossless comparison it runs."""

    draft: DraftModelConfig = DraftModelConfig()
    draft_train: TrainConfig = TrainConfig(steps=1500, batch_size=64, warmup_steps=100)
    """The draft's recipe (AR loss on the task's training split, from scratch)."""
    draft_tokens: tuple[int, ...] = (2, 4)
    """k of the AR drafts, chosen on the validation prompts (the fastest)."""
    windows: tuple[int, ...] = (4, 8)
    """W of setdlm verify, chosen on the validation prompts (the fastest)."""
    n_select: int = 100
    """Validation prompts (the first ones) that choose k and W."""
    n_examples: int = 500
    """Test prompts (the first ones) measured once, at the chosen k and W."""
    transformers: bool = True
    """Also transformers' generate: plain, assisted by the draft, and prompt lookup."""
    threads: int = 1

    def __post_init__(self) -> None:
        check(self.draft_tokens and min(self.draft_tokens) >= 1, "draft_tokens must be >= 1")
        check(self.windows and min(self.windows) >= 1, "windows must be >= 1")
        check(self.n_select >= 1 and self.n_examples >= 1, "n_select, n_examples must be >= 1")
        check(self.threads >= 1, "threads must be >= 1")


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    tokens: list[int]
    forwards: int
    """Forwards of the model whose greedy decode this reproduces (the verifier)."""
    drafts: tuple[int, int] = (0, 0)
    """Drafts checked and accepted."""


Decoder = Callable[[list[int]], Decoded]


def compare(
    decoders: Mapping[str, Decoder],
    references: Mapping[str, str],
    prompts: Sequence[list[int]],
    score: Callable[[list[int], int], float],
    *,
    eos_id: int,
    warmup: list[int],
    best_of: Sequence[str] = (),
    n_boot: int = 1000,
) -> dict[str, Any]:
    """Every decoder on every prompt, interleaved per example; figures per decoder.

    `references[name]`: the decoder whose tokens `name` must reproduce (lossless), if any;
    `score(tokens, example)`: 1.0 for an exact answer. Speedups are over decoder ``ar``, and for
    every decoder outside `best_of` also over the fastest of `best_of` (the AR + speculative
    baselines) on these prompts (``speedup_vs_best``)."""
    for decode in decoders.values():
        decode(warmup)
    rows: list[dict[str, Any]] = []
    outputs: dict[str, list[Decoded]] = {name: [] for name in decoders}
    for i, prompt in enumerate(progress_bar(prompts, desc=f"lossless ({len(decoders)} methods)")):
        for name, decode in decoders.items():
            out, seconds = timed(lambda d=decode, p=prompt: d(p), torch.device("cpu"))
            outputs[name].append(out)
            rows.append(
                {
                    "paradigm": name,
                    "engine": "lossless",
                    "config": name,
                    "example": i,
                    "new_tokens": count_new_tokens(out.tokens, [eos_id]),
                    "latency_s": seconds,
                    "nfe": out.forwards,
                    "exact": score(out.tokens, i),
                }
            )
    grouped = group(rows)
    points = summarize(grouped)
    ar = ("ar", "lossless", "ar")
    best = max(best_of, key=lambda n: points[(n, "lossless", n)].tokens_per_second, default=None)
    figures = {}
    for name in decoders:
        key = (name, "lossless", name)
        checked = sum(o.drafts[0] for o in outputs[name])
        accepted = sum(o.drafts[1] for o in outputs[name])
        reference = references.get(name)
        speedup = bootstrap(
            grouped,
            lambda pts, k=key: pts[k].tokens_per_second / pts[ar].tokens_per_second,
            n_boot=n_boot,
        )
        figures[name] = {
            "accuracy": points[key].accuracy,
            "tokens_per_second": points[key].tokens_per_second,
            "tokens_per_forward": points[key].tokens_per_forward,
            "draft_acceptance": accepted / checked if checked else None,
            "reference": reference,
            "identical_to_reference": None
            if reference is None
            else sum(
                a.tokens == b.tokens for a, b in zip(outputs[name], outputs[reference], strict=True)
            ),
            "n": len(prompts),
            "speedup_vs_ar": {"estimate": speedup[0], "ci95": [speedup[1], speedup[2]]},
        }
        if best is not None and name not in best_of and name != "ar":
            over = bootstrap(
                grouped,
                lambda pts, k=key, b=(best, "lossless", best): (
                    pts[k].tokens_per_second / pts[b].tokens_per_second
                ),
                n_boot=n_boot,
            )
            figures[name]["speedup_vs_best"] = {
                "baseline": best,
                "estimate": over[0],
                "ci95": [over[1], over[2]],
            }
    return figures


def _ours(model: Any, seq_len: int, eos: int, **options: Any) -> Decoder:
    def decode(prompt: list[int]) -> Decoded:
        out = generate(
            model, prompt, max_new_tokens=seq_len - len(prompt), stop_ids=[eos], **options
        )
        return Decoded(out.tokens, out.nfe, out.drafts)

    return decode


def _hf(model: Any, seq_len: int, eos: int, **options: Any) -> Decoder:
    from setdiff.baselines.hf_engine import hf_generate

    def decode(prompt: list[int]) -> Decoded:
        out = hf_generate(model, prompt, seq_len - len(prompt), eos, **options)
        return Decoded(out["tokens"], out["forwards"])

    return decode


@dataclasses.dataclass(frozen=True, slots=True)
class Models:
    """What the comparison decodes: the AR model, its draft, setdlm, and (optional) the AR model
    and the draft loaded into transformers."""

    ar: Any
    draft: Any
    setdlm: Any
    hf_ar: Any = None
    hf_draft: Any = None


def decoders(
    models: Models, ks: Sequence[int], windows: Sequence[int]
) -> tuple[dict[str, Decoder], dict[str, str], list[str]]:
    """The decoders at draft sizes `ks` and windows `windows`, each one's reference, and the
    names of the AR + speculative baselines."""
    tok, seq_len = models.ar.tokenizer, models.ar.net.config.max_seq_len
    eos = tok.eos_id
    out: dict[str, Decoder] = {"ar": _ours(models.ar, seq_len, eos)}
    references: dict[str, str] = {}
    speculative: list[str] = []
    for k in ks:
        name = f"ar+draft k={k}"
        out[name] = _ours(models.ar, seq_len, eos, draft=models.draft, draft_tokens=k)
        references[name] = "ar"
        speculative.append(name)
    if models.hf_ar is not None:
        out["hf"] = _hf(models.hf_ar, seq_len, eos)
        references["hf"] = "ar"
        for k in ks:
            assisted, lookup = f"hf+assisted k={k}", f"hf+lookup k={k}"
            out[assisted] = _hf(
                models.hf_ar, seq_len, eos, assistant_model=models.hf_draft, assistant_tokens=k
            )
            out[lookup] = _hf(models.hf_ar, seq_len, eos, prompt_lookup_num_tokens=k)
            references[assisted] = references[lookup] = "ar"
            speculative += [assisted, lookup]
    out["setdlm W=1"] = _ours(models.setdlm, seq_len, eos, window=1)
    for w in windows:
        out[f"setdlm verify W={w}"] = _ours(models.setdlm, seq_len, eos, window=w, verify=True)
        references[f"setdlm verify W={w}"] = "setdlm W=1"
    return out, references, speculative


def fastest(figures: Mapping[str, Mapping[str, Any]], prefix: str) -> str:
    """The decoder named ``<prefix>...`` with the most tokens/s (the validation choice)."""
    named = [n for n in figures if n.startswith(prefix)]
    return max(named, key=lambda n: figures[n]["tokens_per_second"])


def knob(name: str) -> int:
    """``"ar+draft k=2"`` -> 2."""
    return int(name.rsplit("=", 1)[1])


def check_windows(config: LosslessConfig, setdlm: Any, where: str) -> None:
    """Every window decodes with verify on this setdlm config (shifted queries): checked from
    the preset, before any compute."""
    paradigm = make_paradigm("setdlm", setdlm, mask_id=0)
    for window in config.windows:
        try:
            decode_policy(paradigm, {"window": window, "verify": True})
        except ValueError as err:
            raise ConfigError(f"{where}: lossless.windows: {err}") from None
