"""DecodeState and Plan: what a decoding loop knows between forwards.

The canvas holds the prompt, the slots being generated (``mask_id`` until decoded) and, for
infilling, a given suffix. Tokens move masked -> decoded (accepted by a policy) -> committed (their
K/V written by a forward, in commit order, each with a group; see `setdiff.masks.decode_mask`).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One forward: commit these decoded tokens, query these positions."""

    commit: torch.Tensor  # (C,) positions to commit, in commit order
    groups: torch.Tensor  # (C,) their groups (causal: distinct increasing; block: shared)
    queries: torch.Tensor  # (M,) positions whose outputs the policy reads
    query_attend: torch.Tensor  # (M, M) bool, which query sees which query


@dataclasses.dataclass(slots=True)
class DecodeState:
    canvas: torch.Tensor  # (S,) long
    is_masked: torch.Tensor  # (S,) bool
    is_committed: torch.Tensor  # (S,) bool
    gen_start: int  # first generated slot
    gen_end: int  # one past the last generated slot
    order: torch.Tensor  # (S,) committed positions in commit order; the first n_committed are set
    group_of: torch.Tensor  # (S,) their groups
    n_committed: int = 0
    drafts: int = 0
    """Speculative decoding (``verify=True``, or an AR draft model): the decoded positions just
    left of the frontier that are unverified drafts (see `setdiff.sampling.verify`)."""
    drafts_checked: int = 0
    """Drafts a forward has checked so far; ``drafts_accepted`` of them agreed."""
    drafts_accepted: int = 0

    @classmethod
    def new(cls, prompt: list[int], n_new: int, suffix: list[int], mask_id: int) -> DecodeState:
        canvas = torch.tensor(prompt + [mask_id] * n_new + suffix, dtype=torch.long)
        is_masked = torch.zeros(canvas.numel(), dtype=torch.bool)
        is_masked[len(prompt) : len(prompt) + n_new] = True
        return cls(
            canvas=canvas,
            is_masked=is_masked,
            is_committed=torch.zeros_like(is_masked),
            gen_start=len(prompt),
            gen_end=len(prompt) + n_new,
            order=torch.empty(canvas.numel(), dtype=torch.long),
            group_of=torch.empty(canvas.numel(), dtype=torch.long),
        )

    @property
    def committed(self) -> torch.Tensor:
        """(N,) committed positions in commit order."""
        return self.order[: self.n_committed]

    @property
    def groups(self) -> torch.Tensor:
        """(N,) groups of the committed positions."""
        return self.group_of[: self.n_committed]

    @property
    def next_group(self) -> int:
        return int(self.group_of[self.n_committed - 1]) + 1 if self.n_committed else 0

    @property
    def has_masks(self) -> bool:
        return bool(self.is_masked.any())

    def frontier(self) -> int:
        """Leftmost still-masked position (gen_end when none)."""
        masked = self.is_masked.nonzero()
        return int(masked[0]) if masked.numel() else self.gen_end

    def verified_end(self) -> int:
        """One past the final decoded prefix: the frontier, less any drafts before it."""
        return self.frontier() - self.drafts

    def uncommitted_decoded(self, below: int | None = None) -> torch.Tensor:
        """Positions decoded (or given) but not committed, in position order."""
        ready = ~(self.is_masked | self.is_committed)
        if below is not None:
            ready[below:] = False
        return ready.nonzero().flatten()

    def record_commit(self, positions: torch.Tensor, groups: torch.Tensor) -> None:
        n = positions.numel()
        self.is_committed[positions] = True
        self.order[self.n_committed : self.n_committed + n] = positions
        self.group_of[self.n_committed : self.n_committed + n] = groups
        self.n_committed += n

    def uncommit(self, n: int) -> None:
        """Forget the last `n` commits (drafts a forward committed, then rejected)."""
        self.is_committed[self.order[self.n_committed - n : self.n_committed]] = False
        self.n_committed -= n

    def accept(self, positions: torch.Tensor, tokens: torch.Tensor) -> None:
        if not bool(self.is_masked[positions].all()):
            raise RuntimeError(f"policy accepted already-decoded positions {positions.tolist()}")
        self.canvas[positions] = tokens
        self.is_masked[positions] = False
