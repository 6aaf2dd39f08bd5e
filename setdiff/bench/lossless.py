"""Lossless decoders side by side at batch 1: AR greedy, AR with speculative decoding, and
self-speculative set decoding, each against the greedy decode it must reproduce.

    python -m setdiff.bench.lossless --root RUN --task arith --draft DRAFT_MODEL_DIR
        [--draft-tokens 2,4] [--windows 4,8] [--split valid|test] [--n-examples 500]
        [--transformers] [--out metrics/bench/lossless.json]

Methods (each decodes every prompt once per round, interleaved per example, after an unrecorded
warm-up prompt; wall time per example with the prefill, `setdiff.measure.timed`):
- ``ar``: our AR model, greedy (the reference of every AR method);
- ``ar+draft k=K``: our engine, the draft model (a small AR model of the same vocabulary)
  proposing K tokens that one forward of the AR model checks (``generate(draft=, draft_tokens=)``);
- ``hf``, ``hf+assisted k=K``, ``hf+lookup k=K`` (``--transformers``): the AR model exported to
  Hugging Face, ``generate`` plain, with the exported draft as ``assistant_model``, and with
  prompt lookup decoding;
- ``setdlm W=1`` (the reference of verify) and ``setdlm verify W=W``.
Per method: accuracy (exact match), tokens/s, tokens per forward of the verifying model, the
drafts' acceptance rate, the rows identical to the method's reference (n/N), and tokens/s over
AR's with a paired 95% bootstrap CI over examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from setdiff.artifacts import load_model
from setdiff.evaluate import score_answer
from setdiff.files import write_json
from setdiff.measure import count_new_tokens, fingerprint, timed
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import generate
from setdiff.tasks import read_records
from setdiff.tradeoff import bootstrap, group, summarize


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
    n_boot: int = 1000,
) -> dict[str, Any]:
    """Every decoder on every prompt, interleaved per example; figures per decoder.

    `references[name]`: the decoder whose tokens `name` must reproduce (lossless), if any;
    `score(tokens, example)`: 1.0 for an exact answer. Speedups are over decoder ``ar``."""
    for decode in decoders.values():
        decode(warmup)
    rows: list[dict[str, Any]] = []
    outputs: dict[str, list[Decoded]] = {name: [] for name in decoders}
    for i, prompt in enumerate(prompts):
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m setdiff.bench.lossless",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default=".", help="holds models/<task>/ and data/<task>/")
    parser.add_argument("--task", default="arith")
    parser.add_argument("--draft", required=True, help="the draft: an AR model directory")
    parser.add_argument("--draft-tokens", default="2,4", help="k of the AR drafts")
    parser.add_argument("--windows", default="4,8", help="W of setdlm verify")
    parser.add_argument("--split", default="test", choices=["test", "valid"])
    parser.add_argument("--n-examples", type=int, default=500)
    parser.add_argument("--transformers", action="store_true", help="add the HF engines")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="metrics/bench/lossless.json")
    args = parser.parse_args(argv)
    setup_torch(threads=args.threads, seed=0)
    root, task = Path(args.root), args.task
    ar = load_model(root / "models" / task / "ar", paradigm="ar", task=task)
    draft = load_model(args.draft, paradigm="ar", task=task)
    setdlm = load_model(root / "models" / task / "setdlm", paradigm="setdlm", task=task)
    tok, seq_len = ar.tokenizer, ar.net.config.max_seq_len
    eos = tok.eos_id
    records = read_records(root / "data" / task / "raw" / f"{args.split}.jsonl", task)
    records = records[: args.n_examples]
    prompts = [[tok.bos_id] + tok.encode(r["prompt"]) for r in records]
    ks = [int(k) for k in args.draft_tokens.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    decoders: dict[str, Decoder] = {"ar": _ours(ar, seq_len, eos)}
    references: dict[str, str] = {}
    for k in ks:
        decoders[f"ar+draft k={k}"] = _ours(ar, seq_len, eos, draft=draft, draft_tokens=k)
        references[f"ar+draft k={k}"] = "ar"
    if args.transformers:
        from setdiff.baselines.hf_engine import load_hf_model
        from setdiff.hf import export_hf

        tmp = Path(tempfile.mkdtemp(prefix="lossless-hf."))
        hf_ar = load_hf_model(export_hf(root / "models" / task / "ar", tmp / "ar"))
        hf_draft = load_hf_model(export_hf(Path(args.draft), tmp / "draft"))
        decoders["hf"] = _hf(hf_ar, seq_len, eos)
        references["hf"] = "ar"
        for k in ks:
            decoders[f"hf+assisted k={k}"] = _hf(
                hf_ar, seq_len, eos, assistant_model=hf_draft, assistant_tokens=k
            )
            decoders[f"hf+lookup k={k}"] = _hf(hf_ar, seq_len, eos, prompt_lookup_num_tokens=k)
            references[f"hf+assisted k={k}"] = references[f"hf+lookup k={k}"] = "ar"
    decoders["setdlm W=1"] = _ours(setdlm, seq_len, eos, window=1)
    for w in windows:
        decoders[f"setdlm verify W={w}"] = _ours(setdlm, seq_len, eos, window=w, verify=True)
        references[f"setdlm verify W={w}"] = "setdlm W=1"

    def score(tokens: list[int], i: int) -> float:
        return float(score_answer(task, tok.decode(tokens), records[i])[1] == 1.0)

    with torch.inference_mode():
        figures = compare(decoders, references, prompts, score, eos_id=eos, warmup=prompts[0])
    regime = {"batch_size": 1, "threads": args.threads, "device": "cpu", "split": args.split}
    out = {
        "task": task,
        "regime": regime,
        "draft": str(args.draft),
        "draft_parameters": draft.net.num_parameters(),
        "parameters": ar.net.num_parameters(),
        "figures": figures,
        "fingerprint": fingerprint(torch.device("cpu"), params_hash="cli"),
    }
    write_json(Path(args.out), out)
    for name, f in figures.items():
        s = f["speedup_vs_ar"]
        same = "" if f["reference"] is None else f"  same as {f['reference']}: "
        same += "" if f["reference"] is None else f"{f['identical_to_reference']}/{f['n']}"
        print(
            f"{name:<22} acc {f['accuracy']:.3f}  {f['tokens_per_second']:8.1f} tok/s  "
            f"x{s['estimate']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]  "
            f"tok/fwd {f['tokens_per_forward']:.2f}  accepted {f['draft_acceptance']}{same}"
        )
    print(json.dumps({"regime": regime, "n": len(prompts)}))


if __name__ == "__main__":
    main()
