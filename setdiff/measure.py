"""The measurement contract: one rule for timing, token accounting and memory, for every method.

Every engine (our samplers, our AR decoder, `transformers`, vLLM) produces the same `Row` per
example x configuration:
- latency: wall time of the whole request, prefill included: `time.perf_counter` on CPU, CUDA
  events (after a synchronize) on GPU. Warm-up examples are run and not recorded.
- tokens: ``new_tokens`` counts generated tokens up to and including the stop token (EOS) when
  one fired, else all generated tokens (`count_new_tokens`); prompt tokens include BOS.
- nfe: model forward calls actually made (an HTTP engine reports what the server says, or
  ``new_tokens`` for AR engines, one forward per token after a fused prefill).
- memory: peak RSS of the process on CPU (monotone over a run), peak CUDA allocation per example
  on GPU; KV-cache bytes of committed entries at the end of the decode.
`measure` applies the contract to one prompt under one `Configuration` of our own sampler (the
bench stage's sweep and every ablation trial measure through it).
A run also writes a `fingerprint` (device, threads, versions, git revision, params and checkpoint
hashes). Nothing here imports pandas: rows are plain dicts written as CSV.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from setdiff.artifacts import LoadedModel
from setdiff.config import frozen
from setdiff.evaluate import score_answer
from setdiff.files import atomic_path, sha256_file
from setdiff.runtime import host
from setdiff.sampling.loop import generate
from setdiff.sampling.policies import parse_threshold

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One example decoded under one configuration by one engine."""

    task: str
    paradigm: str
    engine: str  # "setdiff" | "transformers" | "vllm"
    config: str  # human label of the decode configuration, e.g. "W=4 tau=0.9"
    window: int | None
    threshold: float | None  # None = off
    regime: str  # "latency" (batch 1) | "throughput"
    concurrency: int
    example: int
    prompt_tokens: int
    new_tokens: int
    nfe: int
    latency_s: float
    forward_s: float | None
    peak_mem_mb: float
    kv_cache_mb: float | None
    score: float  # the task's quality score of this example (e.g. checker score)
    exact: float  # exact match (1.0 / 0.0) where the task has answers, else NaN
    stopped: bool

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.nfe if self.nfe else math.nan


COLUMNS = [f.name for f in dataclasses.fields(Row)] + ["tokens_per_forward", "tokens_per_second"]


@frozen
class Configuration:
    """One decode configuration of a paradigm: its label (as in the CSV) and decode options."""

    paradigm: str
    label: str
    options: Mapping[str, Any]


def measure(
    model: LoadedModel,
    config: Configuration,
    prompt: list[int],
    *,
    task: str,
    record: Mapping[str, Any],
    index: int,
    seq_len: int,
    seed: int,
    traces: list[dict[str, Any]] | None = None,
) -> Row:
    """Decode one prompt under one configuration; append its step trace to `traces` if given."""
    tok, device = model.tokenizer, next(model.net.parameters()).device
    reset_peak_memory(device)
    result, seconds = timed(
        lambda: generate(
            model,
            prompt,
            max_new_tokens=seq_len - len(prompt),
            stop_ids=[tok.eos_id],
            seed=seed,
            **config.options,
        ),
        device,
    )
    if traces is not None:
        traces.append(
            {
                "paradigm": config.paradigm,
                "config": config.label,
                "example": index,
                "prompt_tokens": len(prompt),
                "steps": result.steps,
            }
        )
    text = tok.decode(result.tokens)
    _, score = score_answer(task, text, record)
    threshold = parse_threshold(config.options.get("threshold"))
    window = config.options.get("window")
    return Row(
        task=task,
        paradigm=config.paradigm,
        engine="setdiff",
        config=config.label,
        window=window if isinstance(window, int) else None,
        threshold=threshold,
        regime="latency",
        concurrency=1,
        example=index,
        prompt_tokens=len(prompt),
        new_tokens=count_new_tokens(result.tokens, [tok.eos_id]),
        nfe=result.nfe,
        latency_s=seconds,
        forward_s=result.forward_seconds,
        peak_mem_mb=peak_memory_mb(device),
        kv_cache_mb=kv_cache_mb(model.net, result.cache_length),
        score=score,
        exact=float(score == 1.0),
        stopped=result.stopped,
    )


def count_new_tokens(tokens: Sequence[int], stop_ids: Iterable[int]) -> int:
    """The one token-accounting rule: up to and including the first stop token, else all."""
    stops = set(stop_ids)
    for i, token in enumerate(tokens):
        if token in stops:
            return i + 1
    return len(tokens)


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """Run `fn` and return (its result, wall seconds) by the device's clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize(device)
        return result, start.elapsed_time(end) / 1000.0
    tic = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - tic


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA allocation since the last reset, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024


def kv_cache_mb(net: torch.nn.Module, entries: int) -> float:
    """Bytes of `entries` committed cache slots across layers (keys and values)."""
    c = net.config
    itemsize = next(net.parameters()).element_size()
    return 2 * c.n_layer * c.n_kv_head * c.head_dim * entries * itemsize / 2**20


def git_revision(cwd: str | Path = ".") -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint(
    device: torch.device, *, params_hash: str, checkpoints: dict[str, Path] | None = None
) -> dict:
    """Where and with what a run was measured (checkpoints: name -> model directory)."""
    hashes = {
        name: sha256_file(path / "model.safetensors")
        for name, path in (checkpoints or {}).items()
        if (path / "model.safetensors").exists()
    }
    return {
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or platform.machine()
        ),
        **host(),
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "params_hash": params_hash,
        "checkpoint_sha256": hashes,
    }


def write_rows(path: str | Path, rows: Sequence[Row]) -> None:
    """Tidy CSV, one row per example x configuration, written atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            record = dataclasses.asdict(row)
            record["tokens_per_forward"] = row.tokens_per_forward
            record["tokens_per_second"] = row.new_tokens / row.latency_s if row.latency_s else ""
            writer.writerow({k: "" if v is None else v for k, v in record.items()})


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows as dicts with numbers parsed (empty cells -> None)."""
    with open(path, newline="") as f:
        return [{k: _parse(v) for k, v in record.items()} for record in csv.DictReader(f)]


def _parse(value: str) -> Any:
    if value == "":
        return None
    if value in ("True", "False"):
        return value == "True"
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in value and "e" not in value else number
