"""The draft model of speculative AR decoding (``generate(ar_model, ..., draft=small_ar_model,
draft_tokens=k)``): a small AR model with its own KV cache proposes k greedy tokens after the
verified prefix; the main model checks them in one forward (`setdiff.sampling.verify`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from setdiff.kv_cache import KVCache
from setdiff.sampling.logits import choose_tokens

if TYPE_CHECKING:
    from setdiff.model import Transformer


class DraftModel:
    """Greedy proposals of an AR backbone `net` over a cache of `capacity` entries (the whole
    decode: nothing is dropped from the left)."""

    def __init__(self, net: Transformer, capacity: int, mask_id: int) -> None:
        self.net, self.mask_id = net, mask_id
        self.device = next(net.parameters()).device
        self.cache = KVCache.for_model(net, capacity)
        self.fed: list[int] = []  # the tokens whose K/V the cache holds
        self.nfe = 0
        """Draft-model forward calls so far."""
        self.seconds = 0.0
        """Wall time inside them."""

    def propose(self, prefix: list[int], n: int) -> list[int]:
        """`n` greedy tokens after `prefix` (the verified tokens of positions 0..)."""
        if n <= 0:
            return []
        keep, limit = 0, min(len(self.fed), len(prefix) - 1)  # feed >= 1 token: its row predicts
        while keep < limit and self.fed[keep] == prefix[keep]:
            keep += 1
        self.cache.crop(keep)
        feed, out = prefix[keep:], []
        for _ in range(n):
            out.append(self._next(feed))
            feed = out[-1:]
        self.fed = prefix + out[:-1]
        return out

    def _next(self, feed: list[int]) -> int:
        """Feed `feed` after the cached tokens (causally); the greedy token after them."""
        tic = time.perf_counter()
        n_cached, T = self.cache.length, len(feed)
        positions = torch.arange(n_cached, n_cached + T, device=self.device)
        mask = None
        if T > 1:
            causal = torch.ones(T, n_cached + T, dtype=torch.bool, device=self.device)
            mask = causal.tril(n_cached)
        tokens = torch.tensor([feed], device=self.device)
        logits = self.net(tokens, positions[None], mask, self.cache)[0, -1:]
        self.cache.commit(T)
        self.nfe += 1
        self.seconds += time.perf_counter() - tic
        return int(choose_tokens(logits, mask_id=self.mask_id)[0])  # its own read, per token
