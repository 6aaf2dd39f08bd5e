"""GPU check: bf16 training steps, cached = uncached decoding on the device, batch-1 decode speed.

    python -m setdiff.bench.gpu [--device cuda] [--out metrics/bench/gpu.json] [--budget 230]

Fits a short slot on one GPU (and, for checking the script itself, runs on CPU with
``--device cpu``). Sections run in order of importance (``--sections``); each is written to the
JSON file as it finishes (atomically: a cut run leaves every finished section readable), with
its wall seconds under ``section_seconds``; a section that would start after ``--budget``
seconds is skipped and listed under ``skipped``, and ``finished`` says whether the run got to its
end. Sized from the first H200 run's section times (2026-12-04: cache 10 s, step 50 s, decode
92 s at 256 tokens and 3 repeats, batched over 140 s, training over 140 s) to about 4 minutes.
Sections:
- ``train``: per paradigm with SDPA dense masks, and setdlm also with FlexAttention block masks
  (on CUDA) and through torch.compile, a few optimizer steps under bf16 autocast (``--dtype``) on
  the same batches: loss finite and decreasing, the largest loss difference to the eager SDPA
  run, first and median step time;
- ``throughput``: training tokens/s of ar and setdlm (bf16, eager SDPA) at the default preset's
  arith backbone and at the 12-layer size, and the model FLOP utilisation (``mfu``: 6 x
  parameters + attention FLOPs per processed token, over the device's dense bf16 peak, where the
  device is in `PEAK_FLOPS`; setdlm processes 2L tokens per sequence);
- ``cache``: per paradigm, tokens of ``use_cache=True`` vs ``use_cache=False`` decoding on the
  device (float32) and the max logit difference;
- ``decode``: batch-1 decode of ``--new-tokens`` tokens for ar / bd3lm / setdlm (threshold off
  and 0.9) and setdlm recomputing every forward (``cached_vs_recompute``), and ar / setdlm with
  ``compile_step=True`` (the static-shape step, CUDA graphs on CUDA: ``compiled_speedup``,
  ``equals_eager``, ``cached_vs_recompute_compiled``), timed with CUDA events (perf_counter on
  CPU), interleaved, median of ``--repeats``;
- ``step``: one forward against a fixed cache of ``--context`` entries, AR (1 input) and a set
  step (2W inputs, the decode mask), eager and through ``torch.compile`` (one fixed shape), per
  forward: ``step_cost_ratio`` (set over AR) eager and compiled, the compiled speedup, and the
  compiled logits' largest difference to eager;
- ``batched``: ``generate_batch`` throughput (all rows' new tokens over wall time) of ar and
  setdlm (threshold 0.9) on ``--n-prompts`` prompts of mixed lengths at each of
  ``--batch-sizes``, the ratio to ar at the same batch size, and whether every row equals its
  batch-1 decode.
Weights are random: this checks the GPU paths and their speed, not model quality.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from setdiff.batching import ArraySplit
from setdiff.files import finite_or_none, write_json
from setdiff.kv_cache import KVCache
from setdiff.masks import decode_mask
from setdiff.measure import timed
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.sampling.loop import generate, generate_batch

MASK_ID = 3
SECTIONS = ("cache", "step", "decode", "throughput", "train", "batched")
"""Every section, in the order a run takes them (most important first)."""
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
"""Dense bf16 tensor-core peak FLOP/s by device name fragment (the vendors' data sheets)."""


SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_kv_head": 1, "d_model": 128, "d_ff": 256},
    # the default preset's arith backbone (~0.7M parameters)
    "default": {"n_layer": 4, "n_head": 4, "n_kv_head": 4, "d_model": 128, "d_ff": 256},
    "small": {"n_layer": 12, "n_head": 12, "n_kv_head": 4, "d_model": 768, "d_ff": 2048},
}


def model_config(size: str, vocab: int, length: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, max_seq_len=length, **SIZES[size])


def check_training(
    config: ModelConfig, device: torch.device, dtype: str, steps: int, batch: int
) -> dict[str, Any]:
    """Training steps per paradigm with dense SDPA masks; setdlm also through torch.compile
    (``setdlm/compile``) and, on CUDA, with FlexAttention block masks (``setdlm/flex``). Every
    variant sees the same batches, so losses compare across variants."""
    g = torch.Generator().manual_seed(0)
    length = min(config.max_seq_len, 128)
    tokens = torch.randint(4, config.vocab_size, (256, length), generator=g)
    tokens[:, 0] = 1
    for i in range(8, length):  # learnable: copy of the token 8 positions back
        tokens[:, i] = tokens[:, i - 8]
    split = ArraySplit(tokens, torch.full((256,), 8), torch.full((256,), length))
    variants = {name: (name, "sdpa", False) for name in PARADIGMS}
    variants["setdlm/compile"] = ("setdlm", "sdpa", True)
    if device.type == "cuda":  # FlexAttention has no backward on CPU
        variants["setdlm/flex"] = ("setdlm", "flex", False)
    report = {
        key: _train_steps(config, split, device, dtype, steps, batch, *variant)
        for key, variant in variants.items()
    }
    for key, result in report.items():
        base = report[key.split("/")[0]]["losses"]
        result["max_loss_diff_vs_sdpa_eager"] = max(
            abs(a - b) for a, b in zip(result["losses"], base, strict=True)
        )
    return report


def _train_steps(
    config: ModelConfig,
    split: ArraySplit,
    device: torch.device,
    dtype: str,
    steps: int,
    batch: int,
    name: str,
    attention: str,
    compiled: bool,
) -> dict[str, Any]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    net = Transformer(config).to(device).train()
    model = torch.compile(net) if compiled else net
    paradigm = make_paradigm(name, mask_id=MASK_ID, attention=attention)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    autocast = torch.autocast(device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    losses, times = [], []
    for _ in range(steps):
        b = split.sample(batch, g).to(device)

        def step(b: Any = b) -> float:
            with autocast:
                loss = paradigm.loss(model, b, g).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return float(loss.detach())

        loss, seconds = timed(step, device)
        losses.append(loss)
        times.append(seconds)
    return {
        "losses": losses,
        "finite": all(math.isfinite(v) for v in losses),
        "decreased": losses[-1] < losses[0],
        "first_step_seconds": times[0],
        "step_seconds": statistics.median(times[1:] or times),
        "step_times": times,
    }


def check_throughput(
    device: torch.device, dtype: str, sizes: list[str], steps: int, batch: int
) -> dict[str, Any]:
    """Training tokens/s and model FLOP utilisation of ar and setdlm at each of `sizes`: eager
    SDPA under autocast, `steps` timed optimizer steps after two warm-up steps."""
    peak = next((v for k, v in PEAK_FLOPS.items() if k in _device_name(device)), None)
    length = 128
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 512, (batch, length), generator=g)
    tokens[:, 0] = 1
    split = ArraySplit(tokens, torch.full((batch,), 8), torch.full((batch,), length))
    out: dict[str, Any] = {"peak_flops": peak, "batch": batch, "seq_len": length}
    for size in sizes:
        config = model_config(size, vocab=512, length=length)
        for name in ("ar", "setdlm"):
            result = _train_steps(
                config, split, device, dtype, steps + 2, batch, name, "sdpa", False
            )
            seconds = statistics.median(result["step_times"][2:])
            processed = batch * length * (2 if name == "setdlm" else 1)  # setdlm: [clean ; masked]
            params = sum(p.numel() for p in Transformer(config).parameters())
            attention = 12 * config.n_layer * config.d_model * processed // batch
            flops = (6 * params + attention) * processed / seconds
            out[f"{name}/{size}"] = {
                "parameters": params,
                "step_seconds": seconds,
                "tokens_per_second": batch * length / seconds,
                "processed_tokens_per_second": processed / seconds,
                "model_flops_per_second": flops,
                "mfu": flops / peak if peak else None,
            }
    return out


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def check_cache(config: ModelConfig, device: torch.device, new_tokens: int) -> dict[str, Any]:
    torch.manual_seed(0)
    net = Transformer(config).to(device).eval()
    options = {
        "ar": {},
        "mdlm": {"chunk_size": 8},
        "bd3lm": {"threshold": 0.5},
        "aogpt": {"order": "confidence"},
        "setdlm": {"window": 4, "threshold": 0.5},
    }
    out = {}
    for name, opts in options.items():
        paradigm = make_paradigm(name, mask_id=MASK_ID)
        runs = [
            generate(
                net,
                [1, 5, 6, 7],
                max_new_tokens=new_tokens,
                paradigm=paradigm,
                use_cache=use,
                trace_logits=True,
                **opts,
            )
            for use in (True, False)
        ]
        diff = max(
            float((a - b).abs().max()) for a, b in zip(runs[0].logits, runs[1].logits, strict=True)
        )
        out[name] = {
            "same_tokens": runs[0].tokens == runs[1].tokens,
            "max_logit_diff": diff,
            "nfe": runs[0].nfe,
        }
    return out


def check_decode(
    config: ModelConfig, device: torch.device, new_tokens: int, repeats: int
) -> dict[str, Any]:
    torch.manual_seed(0)
    net = Transformer(config).to(device).eval()
    cases = {
        "ar": ("ar", {}),
        "bd3lm": ("bd3lm", {"threshold": "off"}),
        "setdlm": ("setdlm", {"window": 4}),
        "setdlm_tau0.9": ("setdlm", {"window": 4, "threshold": 0.9}),
        "setdlm_recompute": ("setdlm", {"window": 4, "use_cache": False}),
        "ar_compiled": ("ar", {"compile_step": True}),
        "setdlm_compiled": ("setdlm", {"window": 4, "compile_step": True}),
        "setdlm_tau0.9_compiled": ("setdlm", {"window": 4, "threshold": 0.9, "compile_step": True}),
    }
    prompt = [1] + list(range(4, 36))
    times: dict[str, list[float]] = {k: [] for k in cases}
    nfe, tokens = {}, {}
    for _ in range(repeats + 1):  # the first round is warm-up
        for key, (name, opts) in cases.items():
            paradigm = make_paradigm(name, mask_id=MASK_ID)
            result, seconds = timed(
                lambda p=paradigm, o=opts: generate(
                    net, prompt, max_new_tokens=new_tokens, paradigm=p, **o
                ),
                device,
            )
            times[key].append(seconds)
            nfe[key], tokens[key] = result.nfe, result.tokens
    out = {
        k: {
            "seconds": statistics.median(v[1:]),
            "tokens_per_second": new_tokens / statistics.median(v[1:]),
            "nfe": nfe[k],
        }
        for k, v in times.items()
    }
    for key in cases:
        out[key]["speed_vs_ar"] = out[key]["tokens_per_second"] / out["ar"]["tokens_per_second"]
    out["cached_vs_recompute"] = out["setdlm_recompute"]["seconds"] / out["setdlm"]["seconds"]
    out["cached_vs_recompute_compiled"] = (
        out["setdlm_recompute"]["seconds"] / out["setdlm_compiled"]["seconds"]
    )
    for key in ("ar", "setdlm", "setdlm_tau0.9"):
        out[f"{key}_compiled"]["compiled_speedup"] = (
            out[key]["seconds"] / out[f"{key}_compiled"]["seconds"]
        )
        out[f"{key}_compiled"]["equals_eager"] = tokens[f"{key}_compiled"] == tokens[key]
    return out


def check_step(
    config: ModelConfig, device: torch.device, context: int, window: int, repeats: int
) -> dict[str, Any]:
    """One AR forward (1 input) and one set step (2W inputs, the decode mask) against the same
    cache of `context` entries, eager and compiled (the same shape every call, so one graph per
    step kind); 20 forwards per timing, interleaved, median of `repeats` rounds after a warm-up
    round that also compiles."""
    torch.manual_seed(0)
    net = Transformer(config).to(device).eval()
    compiled = torch.compile(net, dynamic=False)
    cache = KVCache.for_model(net, context + 2 * window)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        prefix = torch.randint(4, config.vocab_size, (1, context), generator=g).to(device)
        net(prefix, torch.arange(context, device=device)[None], None, cache)
        cache.commit(context)
        groups = torch.arange(context + window, device=device)
        eye = torch.eye(window, dtype=torch.bool, device=device)
        mask = decode_mask(groups, window, eye)
        tokens = torch.randint(4, config.vocab_size, (1, 2 * window), generator=g).to(device)
        positions = torch.arange(context, context + 2 * window, device=device)[None]
        inputs = {
            "ar": (tokens[:, :1], positions[:, :1], None),
            "set": (tokens, positions, mask),
        }
        fns = {
            f"{kind}{'_compiled' if c else ''}": (compiled if c else net, args)
            for kind, args in inputs.items()
            for c in (False, True)
        }
        diff = {}
        for kind, args in inputs.items():
            eager_logits, compiled_logits = net(*args, cache), compiled(*args, cache)
            diff[kind] = float((eager_logits - compiled_logits).abs().max())
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats + 1):
            for key, (model, args) in fns.items():
                _, seconds = timed(
                    lambda m=model, a=args: [m(*a, cache) for _ in range(20)], device
                )
                times[key].append(seconds / 20)
    step = {k: statistics.median(v[1:]) for k, v in times.items()}
    return {
        "context": context,
        "set_inputs": 2 * window,
        **{f"{k}_step_seconds": v for k, v in step.items()},
        "step_cost_ratio": step["set"] / step["ar"],
        "step_cost_ratio_compiled": step["set_compiled"] / step["ar_compiled"],
        "compiled_speedup_ar": step["ar"] / step["ar_compiled"],
        "compiled_speedup_set": step["set"] / step["set_compiled"],
        "max_logit_diff_compiled_ar": diff["ar"],
        "max_logit_diff_compiled_set": diff["set"],
    }


def check_batched(
    config: ModelConfig,
    device: torch.device,
    batch_sizes: list[int],
    n_prompts: int,
    new_tokens: int,
) -> dict[str, Any]:
    """`generate_batch` tokens/s of ar and setdlm (W = 4, threshold 0.9) on the same prompts of
    mixed lengths at each batch size; every row checked against its batch-1 decode."""
    torch.manual_seed(0)
    net = Transformer(config).to(device).eval()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 41, (n_prompts,), generator=g).tolist()
    prompts = [
        [1, *torch.randint(4, config.vocab_size, (n,), generator=g).tolist()] for n in lengths
    ]
    methods = {"ar": ("ar", {}), "setdlm_tau0.9": ("setdlm", {"window": 4, "threshold": 0.9})}
    out: dict[str, Any] = {"n_prompts": n_prompts, "new_tokens": new_tokens}
    for key, (name, opts) in methods.items():
        paradigm = make_paradigm(name, mask_id=MASK_ID)
        rows: dict[int, list[list[int]]] = {}
        seconds: dict[int, float] = {}
        for b in batch_sizes:
            decode = functools.partial(_decode_all, net, prompts, b, new_tokens, paradigm, opts)
            _decode_all(net, prompts[:b], b, new_tokens, paradigm, opts)  # warm-up, excluded
            rows[b], seconds[b] = timed(decode, device)
        one = rows[min(batch_sizes)]
        out[key] = {
            str(b): {
                "tokens_per_second": sum(len(t) for t in rows[b]) / seconds[b],
                "rows_equal_smallest_batch": rows[b] == one,
            }
            for b in batch_sizes
        }
    for b in map(str, batch_sizes):
        ar = out["ar"][b]["tokens_per_second"]
        out["setdlm_tau0.9"][b]["ratio_to_ar"] = out["setdlm_tau0.9"][b]["tokens_per_second"] / ar
    return out


def _decode_all(
    net: Transformer,
    prompts: list[list[int]],
    batch_size: int,
    new_tokens: int,
    paradigm: Any,
    options: dict[str, Any],
) -> list[list[int]]:
    """Every prompt's new tokens, decoded `batch_size` rows at a time."""
    tokens: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        results = generate_batch(
            net,
            prompts[i : i + batch_size],
            max_new_tokens=new_tokens,
            paradigm=paradigm,
            **options,
        )
        tokens += [r.tokens for r in results]
    return tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m setdiff.bench.gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--size", default="small", choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--context", type=int, default=128, help="cache length of `step`")
    parser.add_argument("--batch-sizes", default="1,16,64", help="batch sizes of `batched`")
    parser.add_argument("--n-prompts", type=int, default=64, help="prompts of `batched`")
    parser.add_argument(
        "--throughput-sizes", default="default,small", help="model sizes of `throughput`"
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help="sections, in order")
    parser.add_argument(
        "--budget", type=float, default=230.0, help="seconds after which no section starts"
    )
    parser.add_argument("--out", default="metrics/bench/gpu.json")
    args = parser.parse_args(argv)
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; known: {', '.join(SECTIONS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu to check the script itself")
    config = model_config(args.size, vocab=512, length=512)
    new_tokens = args.new_tokens
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "cache": lambda: check_cache(config, device, min(new_tokens, 64)),
        "step": lambda: check_step(config, device, args.context, 4, args.repeats),
        "decode": lambda: check_decode(config, device, new_tokens, args.repeats),
        "throughput": lambda: check_throughput(
            device, args.dtype, args.throughput_sizes.split(","), args.steps, args.batch
        ),
        "train": lambda: check_training(config, device, args.dtype, args.steps, args.batch),
        "batched": lambda: check_batched(
            config,
            device,
            [int(b) for b in args.batch_sizes.split(",")],
            args.n_prompts,
            min(new_tokens, 64),
        ),
    }
    report: dict[str, Any] = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "size": args.size,
        "budget_seconds": args.budget,
        "section_seconds": {},
        "skipped": {},
        "finished": False,
    }
    start = time.perf_counter()
    for name in sections:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget:
            report["skipped"][name] = f"not started: {elapsed:.0f} s > budget {args.budget:.0f} s"
        else:
            report[name] = runs[name]()
            report["section_seconds"][name] = time.perf_counter() - start - elapsed
            print(f"gpu check: {name} done in {report['section_seconds'][name]:.1f} s", flush=True)
        write_json(args.out, finite_or_none(report))  # NaN losses: null, "finite": false
    report["finished"] = True
    report["total_seconds"] = time.perf_counter() - start
    write_json(args.out, finite_or_none(report))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
