"""The engine's host cost without a GPU (`setdiff.bench.host`): the read counter, the zero-cost
stand-in model, and at most one host read per decode step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from setdiff.bench.host import (
    CONFIG,
    DECODES,
    MASK_ID,
    STOP_ID,
    HostReads,
    StandIn,
    _Counting,
    count_host_reads,
    decode,
    host_ops_per_step,
    host_reads_per_step,
    main,
    prompts,
)
from setdiff.model import Transformer
from setdiff.paradigm import AOGPTConfig, BD3LMConfig, MDLMConfig, SetDLMConfig, make_paradigm
from setdiff.sampling.loop import generate, generate_batch


def test_counter_counts_each_kind_of_host_read() -> None:
    t = torch.arange(5)

    def reads() -> None:
        int(t[1])  # _local_scalar_dense
        bool((t > 2).any())  # _local_scalar_dense
        t.sum().item()  # _local_scalar_dense
        t.nonzero()  # nonzero
        t.tolist()  # Tensor.tolist
        t.cpu()  # Tensor.cpu
        t.numpy()  # Tensor.numpy
        t + 1  # no read

    assert count_host_reads(reads) == 7


def test_counter_restores_tensor_methods() -> None:
    before = {name: getattr(torch.Tensor, name) for name in HostReads.METHODS}
    with pytest.raises(RuntimeError):
        count_host_reads(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert {name: getattr(torch.Tensor, name) for name in HostReads.METHODS} == before


@pytest.mark.parametrize("name", list(DECODES))
@pytest.mark.parametrize("batch", [1, 4])
def test_stand_in_decodes_every_slot(name: str, batch: int) -> None:
    """The zero-cost model drives a whole decode (it never emits the stop id), cached."""
    calls = decode(StandIn(CONFIG), name, batch, new_tokens=12)
    assert 1 <= calls <= 12


@pytest.fixture(scope="module")
def net() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CONFIG).eval()


@pytest.mark.parametrize("name", list(DECODES))
@pytest.mark.parametrize("batch", [1, 16])
def test_at_most_one_host_read_per_step(net: Transformer, name: str, batch: int) -> None:
    """The engine reads each forward's choices of every row in one transfer, and nothing else:
    plans, inputs and stops come from the host's own state (one-engine issue)."""
    with torch.inference_mode():
        assert host_reads_per_step(net, name, batch, new_tokens=24) <= 1


@pytest.mark.parametrize("name", list(DECODES))
def test_a_batched_step_dispatches_about_as_many_ops_as_one_row(name: str) -> None:
    """Greedy rows are chosen all at once and the inputs built for the whole batch: a step of 16
    rows dispatches a few more tensor ops than a step of one, not 16 times as many."""
    with torch.inference_mode():
        one, sixteen = host_ops_per_step(name, 1, 24), host_ops_per_step(name, 16, 24)
    assert sixteen < 3 * one


def test_the_bench_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    main(["--out", str(out), "--repeats", "1", "--new-tokens", "6"])
    figures = json.loads(out.read_text())
    keys = {"ar_b1", "ar_b16", "setdlm_b1", "setdlm_b16"}
    for figure in (
        "host_seconds_per_step",
        "engine_seconds_per_step",
        "host_reads_per_step",
        "host_ops_per_step",
    ):
        assert set(figures[figure]) == keys and all(v > 0 for v in figures[figure].values())
    for key in keys:  # the engine's own time is the total less the stand-in's
        assert figures["engine_seconds_per_step"][key] < figures["host_seconds_per_step"][key]
    assert figures["regime"]["new_tokens"] == 6


OTHER_DECODES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "bd3lm": ("bd3lm", BD3LMConfig(shift=True), {"threshold": 0.9}),
    "mdlm": ("mdlm", MDLMConfig(shift=True, causal_prompt=True), {"chunk_size": 4}),
    "aogpt": ("aogpt", AOGPTConfig(shift=True), {"order": "confidence", "window": 1}),
    "aogpt_random": ("aogpt", AOGPTConfig(shift=True), {"order": "random", "temperature": 1.0}),
    "setdlm_verify": ("setdlm", SetDLMConfig(shift=True), {"window": 4, "verify": True}),
    "setdlm_sampled": ("setdlm", SetDLMConfig(), {"temperature": 1.0, "top_p": 0.9}),
    "ar_sampled": ("ar", None, {"temperature": 1.0}),
}


@pytest.mark.parametrize("name", list(OTHER_DECODES))
@pytest.mark.parametrize("batch", [1, 8])
def test_every_paradigm_reads_once_per_step(net: Transformer, name: str, batch: int) -> None:
    """Every policy and option (sampling, random orders, verify, MDLM's chunks) reads at most
    once per forward too, not only the decodes the bench times."""
    paradigm_name, config, options = OTHER_DECODES[name]
    paradigm = make_paradigm(paradigm_name, config, mask_id=MASK_ID)
    rows, kw = prompts(batch), {"paradigm": paradigm, "stop_ids": [STOP_ID], **options}
    calls: list[int] = []

    def run() -> None:
        counting = _Counting(net)
        if batch == 1:
            generate(counting, rows[0], max_new_tokens=24, **kw)
        else:
            generate_batch(counting, rows, max_new_tokens=24, **kw)
        calls.append(counting.calls)

    with torch.inference_mode():
        assert count_host_reads(run) <= calls[0]
