"""Assertions shared by the decode tests."""

from __future__ import annotations

import torch

from setdiff.sampling.loop import GenerateResult


def assert_same_decode(
    got: GenerateResult, want: GenerateResult, *, same_cache: bool = True
) -> None:
    """Two decodes are the same decode: tokens, decoded positions per forward, NFE, drafts (and
    with `same_cache`, the cache length: not for a recomputed decode) equal, every forward's
    traced logits within 1e-5."""
    assert (got.tokens, got.steps, got.nfe, got.drafts) == (
        want.tokens,
        want.steps,
        want.nfe,
        want.drafts,
    )
    if same_cache:
        assert got.cache_length == want.cache_length
    assert want.logits is not None and got.logits is not None
    for a, b in zip(want.logits, got.logits, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
