"""``baseline``: which engines serve the AR baseline and how (`BaselineConfig`, `VLLMConfig`)."""

from __future__ import annotations

from typing import Literal

from setdiff.config import Count, Count0, Device, Positive, Threads, check, frozen

Engine = Literal["transformers", "vllm"]


@frozen
class VLLMConfig:
    base_url: str | None = None
    """An already running OpenAI-compatible server (loopback); None = start one here."""
    on_unavailable: Literal["fail", "skip"] = "fail"
    """When vLLM cannot run: fail the stage, or record it as skipped with the reason."""
    startup_timeout_s: Positive = 300.0
    concurrency: tuple[Count, ...] = (1, 4)
    """Concurrent requests for the throughput regime."""
    timeout_s: Positive = 60.0
    retries: Count0 = 2
    speculative_tokens: tuple[Count, ...] = ()
    """vLLM's speculative decoding with its n-gram (prompt lookup) proposer, k tokens per step:
    one more server per k, an engine ``vllm+ngram k=K`` (greedy, batch 1; its tokens are
    compared with our AR's on every prompt). Empty = off."""


@frozen
class BaselineConfig:
    engines: tuple[Engine, ...] = ("transformers", "vllm")
    n_examples: int = 100
    warmup: int = 3
    device: Device = "cpu"
    threads: Threads = 1
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    """Throughput regime of our AR (`generate_batch`) and transformers (batched ``generate``):
    the prompts decoded in batches of each size; vLLM's is ``vllm.concurrency``."""
    vllm: VLLMConfig = VLLMConfig()

    def __post_init__(self) -> None:
        check(self.n_examples >= 1 and self.warmup >= 0, "n_examples >= 1 and warmup >= 0")
        check(
            all(isinstance(b, int) and b >= 1 for b in self.batch_sizes),
            f"batch_sizes must be ints >= 1, got {list(self.batch_sizes)}",
        )
