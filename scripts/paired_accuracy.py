"""Per-prompt exact match of a training root's models, and paired differences between two such
files: the side experiments of docs/results.md (seeds, budgets, recipes tried outside DVC).

    # train into a root with the train stage, then score its models on validation prompts
    .venv/bin/setdiff train --params R/params.yaml --root R --task arith --paradigm setdlm
    .venv/bin/python scripts/paired_accuracy.py score R r.json --split valid --n 500
    # a difference: the mean of per-prompt (A - B) exact, 95% percentile bootstrap over prompts
    .venv/bin/python scripts/paired_accuracy.py diff r.json 'setdlm {"window": 1}' r.json 'ar {}'

`score` decodes as the evaluate stage does (`setdiff.evaluate.answer_rows`: greedy, in batches
that give each row its batch-1 tokens) and writes, per decode, the prompts' exact matches, the
accuracy and tokens per forward (new tokens over forwards, summed over the prompts). A decode
already in OUT is kept, so an interrupted run resumes. Decodes are `PARADIGM OPTIONS_JSON`, the
keys of OUT; the default is AR and setdlm at W = 4, W = 1 and verify W = 8. `diff` resamples the
prompts both files share (the first N) 10,000 times with torch's generator seeded 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

DECODES = (
    "ar {}",
    'setdlm {"window": 4}',
    'setdlm {"window": 1}',
    'setdlm {"verify": true, "window": 8}',
)


def score(root: Path, out: Path, split: str, n: int, decodes: list[str]) -> None:
    from setdiff.evaluate import SCORING_BATCH, answer_rows
    from setdiff.runtime import setup_torch
    from setdiff.stages.common import Layout
    from setdiff.tasks import read_records

    parsed = []
    for key in decodes:
        paradigm, _, options = key.partition(" ")
        try:
            parsed.append((key, paradigm, json.loads(options or "{}")))
        except json.JSONDecodeError as err:
            sys.exit(f"paired_accuracy: decode {key!r}: options are not JSON ({err})")
    setup_torch("cpu", threads=1)
    result = json.loads(out.read_text()) if out.exists() else {}
    models = {}
    for key, paradigm, options in parsed:
        if key in result:
            continue
        layout = Layout(root, "arith", paradigm)
        model = models.setdefault(paradigm, layout.load_model("cpu"))
        records = read_records(layout.raw / f"{split}.jsonl", "arith")[:n]
        rows = answer_rows(
            model,
            records,
            task="arith",
            seq_len=model.net.config.max_seq_len,
            decode_options=options,
            show_progress=False,
            batch_size=SCORING_BATCH,
        )
        exact = [int(r["exact"]) for r in rows]
        per_forward = sum(r["new_tokens"] for r in rows) / max(sum(r["nfe"] for r in rows), 1)
        result[key] = {
            "exact": exact,
            "accuracy": sum(exact) / len(exact),
            "tokens_per_forward": round(per_forward, 3),
        }
        print(f"{key}: {result[key]['accuracy']:.3f}, {per_forward:.2f} tokens/forward", flush=True)
        out.write_text(json.dumps(result))


def paired_difference(
    a: list[int], b: list[int], resamples: int = 10_000
) -> tuple[float, float, float]:
    """Mean of a - b over the shared prompts and its 95% percentile bootstrap interval.

    The rule of `reports.analysis.stats.bootstrap_mean_ci` applied to the differences, drawn
    with torch's generator instead of numpy's: the figures recorded in docs/results.md were
    computed this way, and some of their score files no longer exist to recompute them."""
    d = torch.tensor([x - y for x, y in zip(a, b, strict=True)], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    means = d[torch.randint(len(d), (resamples, len(d)), generator=g)].mean(1)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return d.mean().item(), low, high


def read_exact(path: Path, key: str, n: int) -> list[int]:
    entries = json.loads(path.read_text())
    if key not in entries:
        sys.exit(f"paired_accuracy: {path} has no decode {key!r} (it has {', '.join(entries)})")
    return entries[key]["exact"][:n]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("score", help="score a root's models on a split")
    s.add_argument("root", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--split", default="valid", choices=("valid", "test"))
    s.add_argument("--n", type=int, default=500, help="the first N prompts of the split")
    s.add_argument("--decode", action="append", help="PARADIGM OPTIONS_JSON (repeatable)")
    d = commands.add_parser("diff", help="paired difference of two scored decodes, in points")
    d.add_argument("a", type=Path)
    d.add_argument("key_a")
    d.add_argument("b", type=Path)
    d.add_argument("key_b")
    d.add_argument("--n", type=int, default=500)
    args = parser.parse_args(argv)
    if args.command == "score":
        if not (args.root / "data" / "arith" / "raw" / f"{args.split}.jsonl").is_file():
            sys.exit(f"paired_accuracy: {args.root} has no data/arith/raw/{args.split}.jsonl")
        score(args.root, args.out, args.split, args.n, args.decode or list(DECODES))
    else:
        a, b = read_exact(args.a, args.key_a, args.n), read_exact(args.b, args.key_b, args.n)
        if len(a) != len(b):
            sys.exit(f"paired_accuracy: {len(a)} prompts in {args.a} against {len(b)} in {args.b}")
        mean, low, high = paired_difference(a, b)
        print(
            f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] points over {len(a)} prompts"
        )


if __name__ == "__main__":
    main()
