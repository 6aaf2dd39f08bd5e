"""Core benchmark: decode and training costs of the paradigms on one tiny backbone (CPU, batch 1).

    python -m setdiff.bench.core [--out metrics/bench/core.json] [--repeats 5]

Every comparison is a ratio of two measurements taken side by side, interleaved, in one process
(this machine is shared and noisy); each figure is the median over `--repeats` rounds. Weights are
random (speed does not depend on them); decoding uses threshold "off" so every method decodes the
same number of tokens per forward unless stated.

Figures written (with their targets from the core and throughput issues); ``decode`` and
``step`` once per thread count of ``--decode-threads`` (keyed by it), ``train`` at ``--threads``:
- ``cached_vs_recompute_speedup``: setdlm W=4 decode of 256 tokens, KV cache vs full recompute
  (target >= 5); ``recompute_vs_ar_cached``, the same recomputation over AR's cached decode, is
  its ceiling (a cached set step feeds AR's one input and more);
- ``*_compiled``: the same decodes with ``compile_step=True`` (`setdiff.sampling.static`; the
  compiled tokens must equal the eager ones, or the bench fails);
- ``train_step_ratio_{setdlm,bd3lm}``: training step time relative to ar, same batch
  (target <= 2.3; ideal 2, they process 2L tokens).
- ``decode_overhead_share``: share of setdlm decode wall time outside model forwards (<= 0.15).
- ``step_cost_ratio``: one setdlm step (C + W = 8 inputs against the cache) over one AR step
  (1 input) on the same model and context (target <= 1.15), the same ratio measured over whole
  decodes (``step_cost_ratio_in_decode``: C = 1, W = 4), and ``step_cost_by_inputs`` (2, 4, 8).
- ``*_shift``: the decode figures with shifted queries (``shift: true``, the default preset's
  setdlm: each query fed at the position before its own, not seeing that position's key).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from setdiff.batching import ArraySplit
from setdiff.files import write_json
from setdiff.kv_cache import KVCache
from setdiff.masks import decode_mask
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import generate

K = TypeVar("K")
MASK_ID, VOCAB = 3, 64
CONFIG = ModelConfig(
    vocab_size=VOCAB, n_layer=4, n_head=4, n_kv_head=4, d_model=128, d_ff=256, max_seq_len=512
)
"""The default preset's arith backbone (~0.7M parameters, 4 query and KV heads of 32)."""


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def interleaved(fns: dict[K, Callable[[], object]], repeats: int) -> dict[K, float]:
    """Median seconds of each function, run in alternation so drift hits all equally."""
    for fn in fns.values():  # warm-up, excluded
        fn()
    samples: dict[K, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            tic = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - tic)
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_decode(net: Transformer, repeats: int, new_tokens: int) -> dict[str, float]:
    prompt = [1] + list(range(4, 20))
    setdlm, ar = make_paradigm("setdlm", mask_id=MASK_ID), make_paradigm("ar", mask_id=MASK_ID)
    shifted = make_paradigm("setdlm", SetDLMConfig(shift=True), mask_id=MASK_ID)
    results: dict[str, object] = {}

    runs: dict[str, list[tuple[float, float]]] = {}  # (forward seconds, wall seconds) per run

    def run(name: str, paradigm: object, **kw: object) -> Callable[[], None]:
        def go() -> None:
            tic = time.perf_counter()
            results[name] = out = generate(
                net, prompt, max_new_tokens=new_tokens, paradigm=paradigm, **kw
            )
            runs.setdefault(name, []).append((out.forward_seconds, time.perf_counter() - tic))

        return go

    times = interleaved(
        {
            "setdlm_cached": run("setdlm_cached", setdlm, window=4),
            "setdlm_recompute": run("setdlm_recompute", setdlm, window=4, use_cache=False),
            "ar_cached": run("ar_cached", ar),
            "setdlm_shift_cached": run("setdlm_shift_cached", shifted, window=4),
            "setdlm_shift_recompute": run(
                "setdlm_shift_recompute", shifted, window=4, use_cache=False
            ),
            "setdlm_compiled": run("setdlm_compiled", setdlm, window=4, compile_step=True),
            "ar_compiled": run("ar_compiled", ar, compile_step=True),
        },
        repeats,
    )
    for name in ("setdlm_compiled", "ar_compiled"):
        eager = results[name.replace("compiled", "cached")]
        if results[name].tokens != eager.tokens:  # type: ignore[attr-defined]
            raise RuntimeError(f"{name}: the compiled decode's tokens differ from the eager one's")

    def per_step(name: str) -> float:  # median seconds per forward, over the timed runs
        nfe = results[name].nfe  # type: ignore[attr-defined]
        return statistics.median(f for f, _ in runs[name][1:]) / nfe

    def overhead(name: str) -> float:  # median share of a run's wall time outside forwards
        return statistics.median(1 - f / w for f, w in runs[name][1:])

    return {
        "new_tokens": new_tokens,
        "setdlm_cached_seconds": times["setdlm_cached"],
        "setdlm_recompute_seconds": times["setdlm_recompute"],
        "ar_cached_seconds": times["ar_cached"],
        "cached_vs_recompute_speedup": times["setdlm_recompute"] / times["setdlm_cached"],
        "decode_overhead_share": overhead("setdlm_cached"),
        "step_cost_ratio_in_decode": per_step("setdlm_cached") / per_step("ar_cached"),
        "setdlm_shift_cached_seconds": times["setdlm_shift_cached"],
        "cached_vs_recompute_speedup_shift": times["setdlm_shift_recompute"]
        / times["setdlm_shift_cached"],
        "step_cost_ratio_in_decode_shift": per_step("setdlm_shift_cached") / per_step("ar_cached"),
        "setdlm_compiled_seconds": times["setdlm_compiled"],
        "ar_compiled_seconds": times["ar_compiled"],
        "cached_vs_recompute_speedup_compiled": times["setdlm_recompute"]
        / times["setdlm_compiled"],
        "compiled_speedup_setdlm": times["setdlm_cached"] / times["setdlm_compiled"],
        "compiled_speedup_ar": times["ar_cached"] / times["ar_compiled"],
        "step_cost_ratio_in_decode_compiled": per_step("setdlm_compiled") / per_step("ar_compiled"),
        "decode_overhead_share_compiled": overhead("setdlm_compiled"),
        "recompute_vs_ar_cached": times["setdlm_recompute"] / times["ar_cached"],
        "setdlm_nfe": results["setdlm_cached"].nfe,  # type: ignore[attr-defined]
        "ar_nfe": results["ar_cached"].nfe,  # type: ignore[attr-defined]
    }


def bench_step(net: Transformer, repeats: int, context: int, window: int) -> dict[str, Any]:
    """One forward against a cache of `context` entries: AR (1 input) vs set step (2W inputs),
    and the set step's cost as its inputs grow (C = W = 1, 2, 4, ...: ``step_cost_by_inputs``,
    each over AR), which separates the cost of a multi-row step from that of its rows."""
    positions = torch.arange(context)
    cache = KVCache.for_model(net, context + 2 * window)
    with torch.inference_mode():
        net(torch.randint(4, VOCAB, (1, context)), positions[None], None, cache)
        cache.commit(context)
        tokens = torch.randint(4, VOCAB, (1, 2 * window))
        set_pos = torch.arange(context, context + 2 * window)[None]

        def step(w: int) -> Callable[[], None]:
            n = 1 if w == 0 else 2 * w
            mask = None  # AR: one input sees every key
            if w:
                groups = torch.arange(context + w)
                mask = decode_mask(groups, w, torch.eye(w, dtype=torch.bool))

            def go() -> None:
                for _ in range(20):
                    net(tokens[:, :n], set_pos[:, :n], mask, cache)

            return go

        sizes = [w for w in (1, 2, 4, 8) if w < window] + [window]
        times = interleaved({0: step(0), **{w: step(w) for w in sizes}}, repeats)
    return {
        "context": context,
        "set_inputs": 2 * window,
        "ar_step_seconds": times[0] / 20,
        "set_step_seconds": times[window] / 20,
        "step_cost_ratio": times[window] / times[0],
        "step_cost_by_inputs": {str(2 * w): times[w] / times[0] for w in sizes},
    }


def bench_train(net: Transformer, repeats: int, batch: int, length: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, VOCAB, (256, length), generator=generator)
    tokens[:, 0] = 1
    split = ArraySplit(tokens, torch.full((256,), 10), torch.full((256,), length))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step(name: str) -> Callable[[], None]:
        paradigm = make_paradigm(name, mask_id=MASK_ID)

        def go() -> None:
            out = paradigm.loss(net, split.sample(batch, generator), generator)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()

        return go

    times = interleaved({name: step(name) for name in ("ar", "setdlm", "bd3lm", "mdlm")}, repeats)
    return {
        "batch": batch,
        "length": length,
        **{f"train_step_seconds_{k}": v for k, v in times.items()},
        **{f"train_step_ratio_{k}": times[k] / times["ar"] for k in ("setdlm", "bd3lm", "mdlm")},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m setdiff.bench.core",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="metrics/bench/core.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument(
        "--decode-threads",
        default="1,2",
        help="thread counts the decode and step figures are measured at (comma-separated; the "
        "pipeline decodes on 1 thread, `bench.threads`, and trains on 2)",
    )
    args = parser.parse_args(argv)
    setup_torch(threads=args.threads or None, seed=0)
    threads = torch.get_num_threads()
    net = Transformer(CONFIG).eval()
    decode, step = {}, {}
    for n in [int(t) for t in args.decode_threads.split(",")]:
        setup_torch(threads=n)
        decode[str(n)] = bench_decode(net, args.repeats, args.new_tokens)
        step[str(n)] = bench_step(net, args.repeats, context=128, window=4)
    setup_torch(threads=threads)
    figures = {
        "decode": decode,
        "step": step,
        "train": bench_train(net.train(), args.repeats, batch=32, length=64),
        "environment": {
            "torch": torch.__version__,
            "threads": threads,
            "machine": platform.machine(),
            "python": platform.python_version(),
            "parameters": net.num_parameters(),
        },
    }
    write_json(Path(args.out), figures)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
