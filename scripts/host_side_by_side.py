"""The engine's host time per forward of several checkouts, side by side.

    git worktree add --detach /tmp/old 748c84f
    .venv/bin/python scripts/host_side_by_side.py /tmp/old . [--rounds 6]

Each round runs every tree in a fresh process (alternating the order from round to round), and
each process times `setdiff.bench.host.decode` with the zero-cost `StandIn` for AR and setdlm
(W = 4, threshold 0.9) at batch 1 and 16, 128 new tokens, 1 thread, best of 3 decodes. A shared
machine's load only adds time, so the table gives each tree's fastest round, and the ratio of
every tree to the first one: fastest rounds, and the median of the per-round ratios. Each case
twice: the whole decode per forward ("all"), and less the time inside the stand-in's calls, timed
around each by this script for every tree alike ("engine": what a truly zero-cost model would
leave; the stand-in's lookup and module calls are 10-20 us a forward). (The checkout must have
`setdiff.bench.host`.)

``--tokens``: instead, batch-1 tokens/s of `generate` with the default backbone (`CONFIG`, random
weights seeded 0, so a threshold accepts about one token a step), AR and setdlm (W = 4, threshold
0.9), 8 prompts x 64 new tokens per decode, best of 3 (the issue's "no slower at batch 1").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASES = (("ar", 1), ("setdlm", 1), ("ar", 16), ("setdlm", 16))

WORKER = """
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
from setdiff.bench.core import CONFIG
import setdiff.bench.host as host
from setdiff.bench.host import StandIn, decode
inside = [0.0]
forward = host._Counting.forward
def timed(self, *args):
    tic = time.perf_counter()
    out = forward(self, *args)
    inside[0] += time.perf_counter() - tic
    return out
host._Counting.forward = timed
out = {}
for name, batch in json.loads(sys.argv[2]):
    net = StandIn(CONFIG).eval()
    decode(net, name, batch, 128)
    best, engine = float("inf"), float("inf")
    for _ in range(3):
        inside[0] = 0.0
        tic = time.perf_counter()
        calls = decode(net, name, batch, 128)
        seconds = time.perf_counter() - tic
        best, engine = min(best, seconds / calls), min(engine, (seconds - inside[0]) / calls)
    out[f"{name} b{batch} all"] = best * 1e6
    out[f"{name} b{batch} engine"] = engine * 1e6
print(json.dumps(out))
"""

TOKENS_WORKER = """
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
from setdiff.bench.core import CONFIG, MASK_ID
from setdiff.bench.host import DECODES, prompts
from setdiff.model import Transformer
from setdiff.paradigm import make_paradigm
from setdiff.sampling.loop import generate
torch.manual_seed(0)
net = Transformer(CONFIG).eval()
out = {}
with torch.inference_mode():
    for name in ("ar", "setdlm"):
        paradigm_name, config, options = DECODES[name]
        paradigm = make_paradigm(paradigm_name, config, mask_id=MASK_ID)
        rows = prompts(8)
        best = 0.0
        for _ in range(4):  # the first is a warm-up
            tic = time.perf_counter()
            n = sum(
                len(generate(net, row, max_new_tokens=64, paradigm=paradigm, **options).tokens)
                for row in rows
            )
            best = max(best, n / (time.perf_counter() - tic))
        out[f"{name} b1 tokens/s"] = best
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="checkouts; the first is the reference")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", action="store_true", help="batch-1 tokens/s, real backbone")
    args = parser.parse_args(argv)
    worker = TOKENS_WORKER if args.tokens else WORKER
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
            done = subprocess.run(
                [sys.executable, "-c", worker, tree, json.dumps(CASES)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = args.trees[0]
    for key in runs[base][0]:
        pick, unit = (max, "tokens/s") if args.tokens else (min, "us")
        best = {tree: pick(run[key] for run in runs[tree]) for tree in args.trees}
        cells = [f"{tree}: {best[tree]:.0f} {unit}" for tree in args.trees]
        for tree in args.trees[1:]:
            ratios = [a[key] / b[key] for a, b in zip(runs[tree], runs[base], strict=True)]
            cells.append(
                f"{tree}/{base}: {best[tree] / best[base]:.2f} (per round median "
                f"{statistics.median(ratios):.2f})"
            )
        print(f"{key}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
