"""Process-level torch set-up: `setup_torch` sets threads and the global seed when asked, and
leaves each alone when not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from setdiff.runtime import setup_torch


@pytest.fixture(autouse=True)
def restore_torch() -> Iterator[None]:
    """Each test leaves torch's thread count and global RNG as it found them."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)


def test_threads_are_set() -> None:
    setup_torch(threads=1)
    assert torch.get_num_threads() == 1


def test_no_threads_leaves_torch_setting() -> None:
    torch.set_num_threads(1)
    setup_torch(threads=None)
    assert torch.get_num_threads() == 1


def test_threads_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        setup_torch(threads=0)


def test_seeding_is_reproducible_and_matches_manual_seed() -> None:
    setup_torch(seed=3)
    first = torch.rand(8)
    setup_torch(seed=3)
    assert torch.equal(torch.rand(8), first)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(8), first)
    setup_torch(seed=4)
    assert not torch.equal(torch.rand(8), first)


def test_no_seed_leaves_the_rng_stream_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(8)
    torch.manual_seed(5)
    setup_torch(seed=None)
    assert torch.equal(torch.rand(8), expected)


def test_returns_the_device() -> None:
    assert setup_torch("cpu") == torch.device("cpu")
    assert setup_torch(torch.device("cpu")) == torch.device("cpu")
    assert setup_torch() == torch.device("cpu")
