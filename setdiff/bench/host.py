"""The decode engine's host cost, measured without a GPU.

    python -m setdiff.bench.host [--out metrics/bench/host.json] [--repeats 5]

A decode step is a model forward plus the engine's own work around it: planning the step,
building its inputs and mask, choosing and accepting tokens, checking stops. On a GPU that work
runs on the host, and every read of a tensor value by the host (``int(t)``, ``bool(t)``,
``t.item()``, ``t.tolist()``, ``t.nonzero()``, ``t.cpu()``) is a blocking sync once the tensor
lives on the device. Two figures bound how fast a GPU can decode, whatever its speed:

- ``host_seconds_per_step``: decode wall time per forward with `StandIn`, a zero-cost model that
  returns fixed logits instantly (its forward costs a table lookup), so all that is left is the
  engine's host work, plus the stand-in's own lookup;
- ``engine_seconds_per_step``: the same less the time inside the stand-in's calls (timed around
  each): the engine's own host time, what a truly zero-cost model would leave;
- ``host_reads_per_step``: host reads of tensor values per forward, counted by `HostReads` while
  decoding with a real (tiny) model on CPU;
- ``host_ops_per_step``: tensor ops dispatched per forward with `StandIn` (its own two included),
  counted by `OpCount`: on a GPU each is at least a kernel launch or a dispatch on the host.

Both for AR and setdlm (W = 4, threshold 0.9, shifted queries: the default preset's decode), at
batch 1 (`generate`) and batch 16 (`generate_batch`; per batched forward), with a stop id active
as the pipeline decodes (`StandIn` never emits it, so every decode runs its full length).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from setdiff.bench.core import CONFIG, MASK_ID
from setdiff.files import write_json
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import SetDLMConfig, make_paradigm
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import generate, generate_batch

STOP_ID = 2
DECODES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "ar": ("ar", None, {}),
    "setdlm": ("setdlm", SetDLMConfig(shift=True), {"window": 4, "threshold": 0.9}),
}
"""name -> (paradigm, its config, decode options)."""


class StandIn(torch.nn.Module):
    """A zero-cost model for the engine: fixed logits per position, instantly.

    It has the backbone's interface (config, parameters, ``forward(tokens, positions, mask,
    cache)``) and marks its inputs staged in the cache as a real forward would, but computes
    nothing: its logits are rows of a fixed random table, picked by position, so confidences vary
    from slot to slot as a trained model's do."""

    def __init__(self, config: ModelConfig, seed: int = 0, sharpness: float = 8.0) -> None:
        super().__init__()
        self.config = config
        generator = torch.Generator().manual_seed(seed)
        table = torch.randn(config.max_seq_len, config.vocab_size, generator=generator)
        table[:, STOP_ID] = -1e4  # never stops: every decode runs its full length
        self.register_buffer("table", table * sharpness)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the model's dtype and device

    def forward(
        self, tokens_BT: torch.Tensor, positions_BT: torch.Tensor, mask: Any, cache: Any = None
    ) -> torch.Tensor:
        if cache is not None:
            cache.staged = tokens_BT.shape[1]
        return self.table[positions_BT.clamp(min=0)]


class HostReads(TorchDispatchMode):
    """Counts the host's reads of tensor values while active: the dispatcher's
    ``_local_scalar_dense`` (``int``, ``float``, ``bool``, ``item``) and ``nonzero`` (its output
    size is data-dependent), and calls of ``Tensor.tolist``, ``Tensor.cpu`` and ``Tensor.numpy``
    (which never reach the dispatcher on CPU but copy device data to the host on a GPU)."""

    OPS = ("aten._local_scalar_dense.default", "aten.nonzero.default")
    METHODS = ("tolist", "cpu", "numpy")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) in self.OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def methods(self) -> Iterator[None]:
        """Count the `METHODS` too while inside (they are patched on `torch.Tensor`)."""
        originals = {name: getattr(torch.Tensor, name) for name in self.METHODS}

        def counting(original: Callable[..., Any]) -> Callable[..., Any]:
            def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self.count += 1
                return original(tensor, *args, **kwargs)

            return method

        try:
            for name, original in originals.items():
                setattr(torch.Tensor, name, counting(original))
            yield
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


class OpCount(TorchDispatchMode):
    """Counts every tensor op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def host_ops_per_step(name: str, batch: int, new_tokens: int) -> float:
    counter = OpCount()
    with counter:
        calls = decode(StandIn(CONFIG).eval(), name, batch, new_tokens)
    return counter.count / calls


def count_host_reads(fn: Callable[[], Any]) -> int:
    """Host reads of tensor values made by ``fn()``."""
    counter = HostReads()
    with counter, counter.methods():
        fn()
    return counter.count


class _Counting(torch.nn.Module):
    """Wraps a model and counts its forward calls (batched forwards included) and the wall time
    inside them."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net, self.config, self.calls, self.seconds = net, net.config, 0, 0.0

    def forward(self, *args: Any) -> torch.Tensor:
        self.calls += 1
        tic = time.perf_counter()
        out = self.net(*args)
        self.seconds += time.perf_counter() - tic
        return out


def prompts(batch: int, length: int = 17) -> list[list[int]]:
    return [[1] + [4 + (i + j) % 50 for j in range(length - 1 - i % 3)] for i in range(batch)]


def decode(net: torch.nn.Module, name: str, batch: int, new_tokens: int) -> int:
    """Decode `batch` prompts (batch 1: `generate`) and return the forward calls made."""
    return decode_timed(net, name, batch, new_tokens)[0]


def decode_timed(net: torch.nn.Module, name: str, batch: int, new_tokens: int) -> tuple[int, float]:
    """`decode`: the forward calls made and the wall time inside them."""
    paradigm_name, config, options = DECODES[name]
    paradigm = make_paradigm(paradigm_name, config, mask_id=MASK_ID)
    counting = _Counting(net)
    rows, kw = prompts(batch), {"paradigm": paradigm, "stop_ids": [STOP_ID], **options}
    if batch == 1:
        generate(counting, rows[0], max_new_tokens=new_tokens, **kw)
    else:
        generate_batch(counting, rows, max_new_tokens=new_tokens, **kw)
    return counting.calls, counting.seconds


def host_seconds_per_step(
    name: str, batch: int, new_tokens: int, repeats: int
) -> tuple[float, float]:
    """Medians over `repeats` of decode wall time per forward with the zero-cost `StandIn`: in
    all, and less the time inside the stand-in's calls (the engine's own)."""
    net = StandIn(CONFIG).eval()
    decode(net, name, batch, new_tokens)  # warm-up
    per_step, engine = [], []
    for _ in range(repeats):
        tic = time.perf_counter()
        calls, model_seconds = decode_timed(net, name, batch, new_tokens)
        seconds = time.perf_counter() - tic
        per_step.append(seconds / calls)
        engine.append((seconds - model_seconds) / calls)
    return statistics.median(per_step), statistics.median(engine)


def host_reads_per_step(net: torch.nn.Module, name: str, batch: int, new_tokens: int) -> float:
    calls: list[int] = []
    reads = count_host_reads(lambda: calls.append(decode(net, name, batch, new_tokens)))
    return reads / calls[0]


def bench_host(repeats: int, new_tokens: int) -> dict[str, Any]:
    torch.manual_seed(0)
    net = Transformer(CONFIG).eval()
    out: dict[str, Any] = {
        "host_seconds_per_step": {},
        "engine_seconds_per_step": {},
        "host_reads_per_step": {},
        "host_ops_per_step": {},
    }
    for name in DECODES:
        for batch in (1, 16):
            key = f"{name}_b{batch}"
            total, engine = host_seconds_per_step(name, batch, new_tokens, repeats)
            out["host_seconds_per_step"][key] = total
            out["engine_seconds_per_step"][key] = engine
            out["host_reads_per_step"][key] = host_reads_per_step(net, name, batch, new_tokens)
            out["host_ops_per_step"][key] = host_ops_per_step(name, batch, new_tokens)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("metrics/bench/host.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    setup_torch(threads=args.threads, seed=0)
    with torch.inference_mode():
        figures = bench_host(args.repeats, args.new_tokens)
    figures["regime"] = {
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "device": "cpu",
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    write_json(args.out, figures)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
