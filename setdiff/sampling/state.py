"""DecodeState and Plan: what a decoding loop knows between forwards, held on the host as plain
Python values (reading them out of device tensors would cost a blocking read each time).
"""

from __future__ import annotations

import array
import dataclasses

import torch


def long_tensor(values: list[int]) -> torch.Tensor:
    """A 1-D long tensor of host ints (a few times faster than ``torch.tensor(values)``: the
    engine builds several per step)."""
    if not values:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(array.array("q", values), dtype=torch.long)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One forward: commit these decoded tokens, query these positions."""

    commit: list[int]
    """Positions to commit, in commit order."""
    groups: list[int]
    """Their groups (causal: distinct increasing; block: shared)."""
    queries: list[int]
    """Positions whose outputs the policy reads."""
    query_attend: torch.Tensor | str = "self"
    """Which query sees which: "self" (each only itself), "all", or an (M, M) bool tensor."""


@dataclasses.dataclass(slots=True)
class DecodeState:
    canvas: list[int]
    masked: list[bool]
    slot: list[int]
    """Each position's index in commit order (-1: not committed)."""
    gen_start: int
    """First generated slot."""
    gen_end: int
    """One past the last generated slot."""
    order: list[int] = dataclasses.field(default_factory=list)
    """Committed positions, in commit order."""
    group_of: list[int] = dataclasses.field(default_factory=list)
    """Their groups."""
    pending: set[int] = dataclasses.field(default_factory=set)
    """Positions decoded (or given) and not committed."""
    n_masked: int = 0
    drafts: int = 0
    """Speculative decoding (``verify=True``, or an AR draft model): the decoded positions just
    left of the frontier that are unverified drafts (see `setdiff.sampling.verify`)."""
    drafts_checked: int = 0
    """Drafts a forward has checked so far; ``drafts_accepted`` of them agreed."""
    drafts_accepted: int = 0
    _front: int = 0
    """No position in ``[gen_start, _front)`` is masked (the frontier is at or after it)."""

    @classmethod
    def new(cls, prompt: list[int], n_new: int, suffix: list[int], mask_id: int) -> DecodeState:
        start, end = len(prompt), len(prompt) + n_new
        size = end + len(suffix)
        return cls(
            canvas=prompt + [mask_id] * n_new + suffix,
            masked=[start <= p < end for p in range(size)],
            slot=[-1] * size,
            gen_start=start,
            gen_end=end,
            pending=set(range(start)) | set(range(end, size)),
            n_masked=n_new,
            _front=start,
        )

    @property
    def n_committed(self) -> int:
        return len(self.order)

    @property
    def next_group(self) -> int:
        return self.group_of[-1] + 1 if self.group_of else 0

    @property
    def has_masks(self) -> bool:
        return self.n_masked > 0

    def frontier(self) -> int:
        """Leftmost still-masked position (gen_end when none)."""
        while self._front < self.gen_end and not self.masked[self._front]:
            self._front += 1
        return self._front

    def verified_end(self) -> int:
        """One past the final decoded prefix: the frontier, less any drafts before it."""
        return self.frontier() - self.drafts

    def masked_from(self, start: int, stop: int) -> list[int]:
        """Masked positions in ``[start, stop)``, in order."""
        return [p for p in range(start, min(stop, self.gen_end)) if self.masked[p]]

    def uncommitted_decoded(self, below: int | None = None) -> list[int]:
        """Positions decoded (or given) but not committed, in position order."""
        ready = sorted(self.pending)
        return ready if below is None else [p for p in ready if p < below]

    def record_commit(self, positions: list[int], groups: list[int]) -> None:
        """Commit `positions` with `groups`, which never decrease in commit order (the mask
        builder, `setdiff.sampling.inputs`, relies on it)."""
        before = [self.next_group - 1, *groups[:-1]]
        if groups and not all(a <= b for a, b in zip(before, groups, strict=True)):
            raise RuntimeError(f"commit groups {groups} decrease after {self.group_of[-1:]}")
        for i, p in enumerate(positions, start=len(self.order)):
            self.slot[p] = i
            self.pending.discard(p)
        self.order.extend(positions)
        self.group_of.extend(groups)

    def uncommit(self, n: int) -> None:
        """Forget the last `n` commits (drafts a forward committed, then rejected)."""
        for p in self.order[len(self.order) - n :]:
            self.slot[p] = -1
            self.pending.add(p)
        del self.order[len(self.order) - n :], self.group_of[len(self.group_of) - n :]

    def accept(self, positions: list[int], tokens: list[int]) -> None:
        for p, t in zip(positions, tokens, strict=True):
            if not self.masked[p]:
                raise RuntimeError(f"policy accepted already-decoded position {p}")
            self.canvas[p], self.masked[p] = t, False
            self.pending.add(p)
        self.n_masked -= len(positions)

    def mask_again(self, positions: list[int], mask_id: int) -> None:
        """Undo decoded, uncommitted positions (drafts rejected before they were committed)."""
        for p in positions:
            self.canvas[p], self.masked[p] = mask_id, True
            self.pending.discard(p)
        self.n_masked += len(positions)
        self._front = min([self._front, *positions])
