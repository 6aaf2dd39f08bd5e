"""The engine's host cost without a GPU (`setdiff.bench.host`): the read counter, the zero-cost
stand-in model, and at most one host read per decode step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from setdiff.bench.host import (
    CONFIG,
    DECODES,
    HostReads,
    StandIn,
    count_host_reads,
    decode,
    host_ops_per_step,
    host_reads_per_step,
    main,
)
from setdiff.model import Transformer


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
    for figure in ("host_seconds_per_step", "host_reads_per_step", "host_ops_per_step"):
        assert set(figures[figure]) == keys and all(v > 0 for v in figures[figure].values())
    assert figures["regime"]["new_tokens"] == 6
