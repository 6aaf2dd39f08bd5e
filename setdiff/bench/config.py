"""``bench``: how the bench stage measures (``bench.run``, `BenchRunConfig`) and what
(``bench.sweep`` over ``decode``: the `Configuration` of every paradigm and knob combination)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from setdiff.config import ConfigError, Device, Seed, check, frozen
from setdiff.measure import Configuration


@frozen
class ThroughputConfig:
    """The throughput regime: chosen configurations decoded in batches (`generate_batch`)."""

    batch_sizes: tuple[int, ...] = ()
    """Batch sizes to measure; empty = no throughput sweep (its JSON says so)."""
    n_examples: int = 32
    """Test prompts decoded at every batch size (the first ones)."""
    configs: tuple[str, ...] = ()
    """``"<paradigm> <label>"`` of `bench.sweep` configurations (labels as in the CSV, e.g.
    ``"setdlm threshold=0.9 window=2"``, ``"ar default"``); empty = the first configuration of
    every paradigm. Batched AR is always measured (the ratios are against it)."""
    transformers: bool = False
    """Also transformers' batched greedy AR (the AR model exported to HF) side by side, so each
    method's ratio to the fastest AR engine at every batch size, and the crossover batch size,
    come from one interleaved run."""

    def __post_init__(self) -> None:
        check(all(b >= 1 for b in self.batch_sizes), "batch_sizes must be >= 1")
        check(self.n_examples >= 1, "n_examples must be >= 1")


@frozen
class BenchRunConfig:
    n_examples: int = 200
    """Test prompts measured per configuration (the first ones)."""
    warmup: int = 3
    """Validation prompts run by every configuration first, not recorded."""
    n_select: int = 0
    """Validation prompts (the first ones) measured like the test prompts, into
    ``results/bench/<task>.select.csv``: the tradeoff stage chooses its operating points on
    them and reports the test prompts' ratios at those fixed points. 0 = choose on the test
    prompts themselves (the bootstrap then redoes the choice in every resample)."""
    seed: Seed = 0
    device: Device = "cpu"
    threads: int = 1
    """torch intra-op threads (batch-1 decoding of small models is fastest and steadiest on 1)."""
    throughput: ThroughputConfig = ThroughputConfig()
    """The throughput sweep, run after the latency sweep (`setdiff.bench.throughput`)."""

    def __post_init__(self) -> None:
        check(self.n_examples >= 1, "n_examples must be >= 1")
        check(self.warmup >= 0, "warmup must be >= 0")
        check(self.n_select >= 0, "n_select must be >= 0")
        check(self.threads >= 0, "threads must be >= 0")


def configurations(
    sweep: Mapping[str, Any],
    decode: Callable[[str], Mapping[str, Any]],
    paradigms: tuple[str, ...],
    where: str,
) -> list[Configuration]:
    """Every (paradigm, decode options) of ``bench.sweep`` over ``decode(paradigm)`` (the
    ``decode.<paradigm>`` options); `where` names the params file in errors. A paradigm's sweep
    is one grid (``{knob: [values]}``, every combination) or a list of grids (their union, for
    knobs that matter only at some values of another, e.g. mdlm's threshold at chunk_size 1).

    Raises:
        ConfigError: on a sweep paradigm outside the study, a knob without a non-empty list, or
            one combination listed twice.
    """
    unknown = sorted(set(sweep) - set(paradigms))
    if unknown:
        raise ConfigError(f"{where}: bench.sweep: paradigms {unknown} are not in the study")
    out = []
    for name in paradigms:
        base = dict(decode(name))
        spec = sweep.get(name) or {}
        grids = spec if isinstance(spec, list) else [spec]
        labels: set[str] = set()
        for grid in grids:
            if not isinstance(grid, Mapping):
                raise ConfigError(f"{where}: bench.sweep.{name}: need a grid or a list of grids")
            for key, values in grid.items():
                if not isinstance(values, list) or not values:
                    raise ConfigError(f"{where}: bench.sweep.{name}.{key}: need a non-empty list")
            keys = sorted(grid)
            for combo in itertools.product(*(grid[k] for k in keys)):
                chosen = dict(zip(keys, combo, strict=True))
                label = " ".join(f"{k}={v}" for k, v in chosen.items()) or "default"
                if label in labels:
                    raise ConfigError(f"{where}: bench.sweep.{name}: {label!r} listed twice")
                labels.add(label)
                out.append(Configuration(paradigm=name, label=label, options={**base, **chosen}))
    return out


def throughput_configurations(
    configs: list[Configuration], chosen: tuple[str, ...], where: str
) -> list[Configuration]:
    """The configurations named in `chosen` (AR first, always), or every paradigm's first."""
    by_name = {f"{c.paradigm} {c.label}": c for c in configs}
    unknown = [name for name in chosen if name not in by_name]
    if unknown:
        raise ConfigError(
            f"{where}: bench.run.throughput.configs: {unknown} are not bench.sweep "
            f"configurations; known: {sorted(by_name)}"
        )
    if not chosen:
        firsts: dict[str, Configuration] = {}
        for c in configs:
            firsts.setdefault(c.paradigm, c)
        picked = list(firsts.values())
    else:
        picked = [by_name[name] for name in dict.fromkeys(chosen)]
    ar = next(c for c in configs if c.paradigm == "ar")
    return [ar] + [c for c in picked if c.paradigm != "ar" or c is not ar]
