"""``lmeval``: what the lmeval stage evaluates through lm-evaluation-harness, on which engines."""

from __future__ import annotations

from typing import Literal

from setdiff.config import Count, Device, Positive, Seed, Threads, check, frozen


@frozen
class LmevalVLLMConfig:
    run: bool = True
    """Evaluate the AR export served by vLLM through lm-eval's ``local-completions`` client."""
    on_unavailable: Literal["fail", "skip"] = "skip"
    """When vLLM cannot run: fail the stage, or record it as skipped with the reason."""
    startup_timeout_s: Positive = 300.0
    timeout_s: Count = 60
    """Per request (lm-eval's client retries 3 times)."""


@frozen
class LmevalConfig:
    tasks: tuple[str, ...] = ()
    """Answer tasks the DVC stage runs on (``lmeval@<task>``; read by dvc.yaml's foreach)."""
    n_examples: int = 200
    """First test prompts evaluated (the same ones for every engine)."""
    paradigms: tuple[str, ...] = ("ar", "setdlm")
    """Models ``models/<task>/<paradigm>`` evaluated on our engine, each at ``decode.<p>``."""
    seed: Seed = 0
    device: Device = "cpu"
    threads: Threads = 1
    """torch intra-op threads; 0 = torch's default."""
    vllm: LmevalVLLMConfig = LmevalVLLMConfig()

    def __post_init__(self) -> None:
        check(self.n_examples >= 1, "n_examples must be >= 1")
        check(len(self.paradigms) > 0, "paradigms must not be empty")
