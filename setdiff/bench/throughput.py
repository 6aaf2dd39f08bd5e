"""Throughput regime: tokens/s of batched decoding at several batch sizes, for every paradigm.

    python -m setdiff.bench.throughput --root . --task arith [--batch-sizes 1,4,16,64]
        [--n-examples 64] [--split test|valid] [--config "setdlm:window=4,threshold=0.9"]
        [--stand-in] [--weights P=F] [--out metrics/bench/throughput.json]

Each method (a paradigm's model with one decode configuration; AR is plain batched AR in our
engine) decodes the first `n_examples` test prompts in chunks of B with `generate_batch`. The
measurement contract is the bench stage's: for each chunk every method runs once, in a fixed
order (interleaved, so drift hits all alike); a warm-up chunk per method and batch size is run
first and not recorded; new tokens are counted up to and including the stop; wall time
(`setdiff.measure.timed`) covers the whole batched decode, prefill included. A batched run's
tokens/s is the total new tokens of all rows over the total wall time. Every row is checked
against the batch-1 run of the same method: same tokens (hence the same accuracy); and
``identical_rows`` counts, per other method, the rows with the same tokens (a lossless decode,
e.g. setdlm ``verify=true``, against its reference: setdlm ``window=1``), beside the drafts'
acceptance rate where the method drafts.

`--stand-in` decodes a paradigm whose model directory is missing with the AR checkpoint's weights
under that paradigm's sampler: its step costs are real, its tokens (and so its accuracy and tokens
per forward) are not those of a trained model; the figures say ``stand_in: true``.
`--weights setdlm=file.pt` decodes a paradigm with a state dict of the AR backbone's shape instead
(e.g. a fine-tune kept outside models/), under the `STAND_IN_CONFIGS` settings.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from setdiff.artifacts import LoadedModel, load_model
from setdiff.config import ConfigError
from setdiff.evaluate import score_answer
from setdiff.files import write_json
from setdiff.measure import count_new_tokens, fingerprint, peak_memory_mb, timed
from setdiff.paradigm import PARADIGMS, make_paradigm
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import GenerateResult, generate_batch
from setdiff.sampling.policies import decode_policy
from setdiff.tasks import read_records

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Method:
    """One paradigm's model under one decode configuration."""

    paradigm: str
    label: str
    model: LoadedModel
    options: Mapping[str, Any]
    stand_in: bool = False
    engine: Any = None
    """A transformers causal LM (`setdiff.baselines.hf_engine.load_hf_model`) that decodes this
    ``ar`` method instead of our engine: transformers' batched greedy AR, the same model."""

    @property
    def name(self) -> str:
        return f"{self.paradigm} {self.label}"


@dataclasses.dataclass(slots=True)
class _Tally:
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    new_tokens: int = 0
    forwards: int = 0
    rows: list[GenerateResult] = dataclasses.field(default_factory=list)
    scores: list[float] = dataclasses.field(default_factory=list)
    peak_mem_mb: float = 0.0


def decode_chunk(
    method: Method, prompts: list[list[int]], *, seq_len: int, seed: int
) -> tuple[list[GenerateResult], float, float]:
    """Decode `prompts` as one batch (each up to `seq_len` tokens, stopping at EOS); the results,
    the wall seconds and the process CPU seconds (on a shared machine the CPU time says what the
    decode cost, the wall time also what the neighbours took)."""
    eos = method.model.tokenizer.eos_id
    device = next(method.model.net.parameters()).device
    budgets = [seq_len - len(p) for p in prompts]
    cpu = time.process_time()
    if method.engine is not None:
        from setdiff.baselines.hf_engine import hf_generate_batch  # transformers: imported late

        out, seconds = timed(
            lambda: hf_generate_batch(method.engine, prompts, budgets, eos), device
        )
        rows = [  # one forward per new token, as our AR (the prefill's gives the first)
            GenerateResult(t, len(t), [], bool(t) and t[-1] == eos, out["seconds"])
            for t in out["tokens"]
        ]
        return rows, seconds, time.process_time() - cpu
    rows, seconds = timed(
        lambda: generate_batch(
            method.model,
            prompts,
            max_new_tokens=budgets,
            stop_ids=[eos],
            seed=seed,
            **method.options,
        ),
        device,
    )
    return rows, seconds, time.process_time() - cpu


def sweep(
    methods: Sequence[Method],
    records: Sequence[Mapping[str, Any]],
    warmup: Sequence[Mapping[str, Any]],
    batch_sizes: Sequence[int],
    *,
    task: str,
    seq_len: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Figures per (method, batch size); see the module docstring for the contract."""
    tok = methods[0].model.tokenizer
    encode = lambda r: [tok.bos_id] + tok.encode(r["prompt"])  # noqa: E731
    prompts, warm = (
        [encode(r) for r in records],
        [encode(r) for r in warmup] or [encode(records[0])],
    )
    figures, batch1_tokens = [], {}
    for B in batch_sizes:
        tallies = {m.name: _Tally() for m in methods}
        warm_chunk = (warm * B)[:B]
        for method in methods:
            decode_chunk(method, warm_chunk, seq_len=seq_len, seed=seed)
        for start in range(0, len(prompts), B):
            chunk = prompts[start : start + B]
            for method in methods:
                rows, seconds, cpu = decode_chunk(method, chunk, seq_len=seq_len, seed=seed)
                tally = tallies[method.name]
                tally.seconds += seconds
                tally.cpu_seconds += cpu
                tally.forwards += max(r.nfe for r in rows)
                tally.peak_mem_mb = max(tally.peak_mem_mb, peak_memory_mb(torch.device("cpu")))
                for row, record in zip(rows, records[start : start + B], strict=True):
                    tally.rows.append(row)
                    tally.new_tokens += count_new_tokens(row.tokens, [tok.eos_id])
                    tally.scores.append(score_answer(task, tok.decode(row.tokens), record)[1])
        ar = next((tallies[m.name] for m in methods if m.paradigm == "ar"), None)
        tokens_of = {name: [r.tokens for r in tally.rows] for name, tally in tallies.items()}
        for method in methods:
            tally = tallies[method.name]
            tokens = tokens_of[method.name]
            checked, accepted = (sum(r.drafts[i] for r in tally.rows) for i in (0, 1))
            batch1_tokens.setdefault(method.name, tokens if B == 1 else None)
            reference = batch1_tokens[method.name]
            figures.append(
                {
                    "method": method.name,
                    "paradigm": method.paradigm,
                    "config": method.label,
                    "stand_in": method.stand_in,
                    "batch_size": B,
                    "n_examples": len(tally.rows),
                    "new_tokens": tally.new_tokens,
                    "seconds": tally.seconds,
                    "tokens_per_second": tally.new_tokens / tally.seconds,
                    "cpu_seconds": tally.cpu_seconds,
                    "tokens_per_cpu_second": tally.new_tokens / tally.cpu_seconds,
                    "speedup_vs_ar": _ratio(tally, ar, "seconds"),
                    "cpu_speedup_vs_ar": _ratio(tally, ar, "cpu_seconds"),
                    # exact match, as the bench rows and the evaluate stage count it; the
                    # task's mean score (partial credit) beside it
                    "accuracy": statistics.fmean(float(x == 1.0) for x in tally.scores),
                    "score": statistics.fmean(tally.scores),
                    "nfe_mean": statistics.fmean(r.nfe for r in tally.rows),
                    "tokens_per_forward": tally.new_tokens / sum(r.nfe for r in tally.rows),
                    "batched_forwards": tally.forwards,
                    "identical_to_batch1": None if reference is None else tokens == reference,
                    # rows whose tokens equal another method's rows (a lossless decode against
                    # its reference greedy decode: n of n_examples)
                    "identical_rows": {
                        other: sum(a == b for a, b in zip(tokens, rows, strict=True))
                        for other, rows in tokens_of.items()
                        if other != method.name
                    },
                    # verify: drafts checked and the share accepted (None without drafts)
                    "drafts_checked": checked,
                    "draft_acceptance": accepted / checked if checked else None,
                    "peak_mem_mb": tally.peak_mem_mb,
                }
            )
    return figures


def against_best_ar(figures: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per non-AR method: at each batch size its tokens/s over the fastest AR engine's there
    (ours or transformers'), and the crossover: the smallest batch size where that ratio falls
    below 1 (None: not within the sweep), overall and against each AR engine."""
    sizes = sorted({f["batch_size"] for f in figures})
    ar = {
        (f["method"], f["batch_size"]): f["tokens_per_second"]
        for f in figures
        if f["paradigm"] == "ar"
    }
    engines = sorted({m for m, _ in ar})
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(f["method"] for f in figures if f["paradigm"] != "ar"):
        speed = {f["batch_size"]: f["tokens_per_second"] for f in figures if f["method"] == method}
        best = {b: max(engines, key=lambda e: ar.get((e, b), 0.0)) for b in sizes}
        ratios = {b: speed[b] / ar[(best[b], b)] for b in sizes if (best[b], b) in ar}

        def first_below(ratio: Mapping[int, float]) -> int | None:
            return next((b for b in sizes if b in ratio and ratio[b] < 1.0), None)

        per_engine = {
            e: first_below({b: speed[b] / ar[(e, b)] for b in sizes if (e, b) in ar})
            for e in engines
        }
        out[method] = {
            "ratio_to_best_ar": {str(b): r for b, r in ratios.items()},
            "best_ar": {str(b): best[b] for b in sizes},
            "crossover": first_below(ratios),
            "crossover_vs": per_engine,
        }
    return out


def _ratio(tally: _Tally, ar: _Tally | None, clock: str) -> float | None:
    """Tokens/s of `tally` over AR's at the same batch size, by the wall or the CPU clock."""
    if ar is None:
        return None
    return (tally.new_tokens / getattr(tally, clock)) / (ar.new_tokens / getattr(ar, clock))


STAND_IN_CONFIGS: dict[str, dict[str, Any]] = {
    "mdlm": {"pad_targets": True},
    "bd3lm": {"block_size": 4},
    "aogpt": {"ltr_share": 0.1, "pad_targets": True},
    "setdlm": {"set_size": 4},
}
"""Paradigm settings of a stand-in (the default preset's `paradigm` section)."""

DEFAULT_CONFIGS = [
    "ar:",
    "setdlm:window=4,threshold=off",
    "setdlm:window=4,threshold=0.9",
    "setdlm:window=8,threshold=0.9",
    "bd3lm:threshold=0.9",
    "aogpt:order=confidence,window=4",
    "mdlm:chunk_size=8,threshold=0.9",
]


def parse_config(text: str) -> tuple[str, str, dict[str, Any]]:
    """``"setdlm:window=2,threshold=0.9"`` -> (paradigm, label, options); values parsed as
    int, float, "off"/"all" or None ("none")."""
    paradigm, _, rest = text.partition(":")
    if paradigm not in PARADIGMS:
        raise ConfigError(f"--config {text!r}: unknown paradigm {paradigm!r}")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--config {text!r}: expected key=value, got {item!r}")
        options[key] = _parse_value(value)
    label = " ".join(f"{k}={v}" for k, v in options.items()) or "default"
    return paradigm, label, options


def _parse_value(value: str) -> Any:
    if value.lower() == "none":
        return None
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def load_methods(
    root: Path,
    task: str,
    configs: Sequence[str],
    *,
    stand_in: bool,
    weights: Mapping[str, Path] | None = None,
) -> list[Method]:
    """A `Method` per config; a missing model directory is an error unless `stand_in`.

    `weights` maps a paradigm to a state dict of the AR backbone's shape (e.g. a fine-tune kept
    outside models/), decoded under that paradigm's `STAND_IN_CONFIGS` settings."""
    ar_dir = root / "models" / task / "ar"
    ar = load_model(ar_dir, paradigm="ar", task=task)
    models: dict[str, tuple[LoadedModel, bool]] = {"ar": (ar, False)}
    for paradigm, path in (weights or {}).items():
        if paradigm not in STAND_IN_CONFIGS:
            raise ConfigError(f"--weights: {paradigm!r} must be one of {sorted(STAND_IN_CONFIGS)}")
        net = copy.deepcopy(ar.net)
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        config = PARADIGMS[paradigm][0](**STAND_IN_CONFIGS[paradigm])
        loaded = make_paradigm(paradigm, config, mask_id=ar.paradigm.mask_id)
        models[paradigm] = (LoadedModel(net.eval(), loaded, ar.tokenizer, Path(path)), False)
    methods = []
    for text in configs:
        paradigm, label, options = parse_config(text)
        if paradigm not in models:
            path = root / "models" / task / paradigm
            if (path / "config.json").exists():
                models[paradigm] = (load_model(path, paradigm=paradigm, task=task), False)
            elif stand_in:
                config = PARADIGMS[paradigm][0](**STAND_IN_CONFIGS.get(paradigm, {}))
                standin = make_paradigm(paradigm, config, mask_id=ar.paradigm.mask_id)
                models[paradigm] = (dataclasses.replace(ar, paradigm=standin), True)
            else:
                raise ConfigError(f"--config {text!r}: no model at {path} (use --stand-in)")
        model, is_stand_in = models[paradigm]
        decode_policy(model.paradigm, dict(options))  # validate before any compute
        methods.append(Method(paradigm, label, model, options, is_stand_in))
    return methods


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m setdiff.bench.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default=".", help="holds models/<task>/ and data/<task>/")
    parser.add_argument("--task", default="arith")
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument("--n-examples", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2, help="validation prompts to warm up on")
    parser.add_argument("--config", action="append", help="paradigm:key=value,... (repeat)")
    parser.add_argument("--stand-in", action="store_true")
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        help="paradigm=file.pt: that paradigm's weights (a state dict of the AR backbone's shape)",
    )
    parser.add_argument(
        "--split",
        default="test",
        choices=["test", "valid"],
        help="the prompts measured: valid to choose a configuration (W, a threshold), test to "
        "measure the chosen one",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="metrics/bench/throughput.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError as err:
        raise ConfigError(
            f"--batch-sizes: expected integers like 1,4,16, got {args.batch_sizes!r}"
        ) from err
    if not sizes or min(sizes) < 1 or args.n_examples < 1:
        raise ConfigError("--batch-sizes and --n-examples must be >= 1")
    setup_torch(threads=args.threads)
    root = Path(args.root)
    weights = {}
    for item in args.weights:
        paradigm, eq, path = item.partition("=")
        if not eq or not Path(path).is_file():
            raise ConfigError(f"--weights: expected paradigm=existing_file.pt, got {item!r}")
        weights[paradigm] = Path(path)
    configs = args.config or DEFAULT_CONFIGS
    if all(parse_config(c)[0] != "ar" for c in configs):  # every ratio is to batched AR
        configs = ["ar:", *configs]
    methods = load_methods(root, args.task, configs, stand_in=args.stand_in, weights=weights)
    raw = root / "data" / args.task / "raw"
    records = read_records(raw / f"{args.split}.jsonl", args.task)[: args.n_examples]
    warmup = read_records(raw / "valid.jsonl", args.task)[: args.warmup]
    seq_len = methods[0].model.net.config.max_seq_len
    figures = sweep(
        methods, records, warmup, sizes, task=args.task, seq_len=seq_len, seed=args.seed
    )
    out = {
        "task": args.task,
        "split": args.split,
        "batch_sizes": sizes,
        "figures": figures,
        "fingerprint": fingerprint(torch.device("cpu"), params_hash="cli"),
    }
    write_json(Path(args.out), out)
    for f in figures:
        print(
            f"{f['method']:<36} B={f['batch_size']:<3} {f['tokens_per_second']:8.1f} tok/s "
            f"x{f['speedup_vs_ar']:.2f} vs ar | CPU {f['tokens_per_cpu_second']:8.1f} tok/s "
            f"x{f['cpu_speedup_vs_ar']:.2f} | acc {f['accuracy']:.3f}  "
            f"tok/fwd {f['tokens_per_forward']:.2f}  same as B=1: {f['identical_to_batch1']}"
            + ("  (stand-in)" if f["stand_in"] else "")
        )


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:  # ConfigError, a bad decode option: one line, exit status 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
