"""Speculative decoding, lossless w.r.t. left-to-right greedy decoding: drafts (from the set
queries, ``verify=True``, or a draft model, ``draft_tokens=k``) checked by the model's own greedy
predictions of its committed rows; the longest agreeing prefix is accepted, the first
disagreement corrected, a full agreement earns a bonus token. See docs/design.md, "The decode
engine".
"""

from __future__ import annotations

from collections.abc import Callable

from setdiff.sampling.state import DecodeState, Plan


def draft(state: DecodeState, positions: list[int], tokens: list[int]) -> list[int]:
    """The drafts for `positions` of `state`: the greedy tokens of their queries (the tests swap
    in perfect and wrong drafts here)."""
    return tokens


def _targets(state: DecodeState) -> range:
    """The positions a forward verifies at most: the drafts and the one after them."""
    start = state.verified_end()  # the first draft; start - 1 is verified, committed just now
    return range(start, min(start + state.drafts + 1, state.gen_end))


def rows(state: DecodeState, plan: Plan) -> list[int]:
    """The rows of a forward's logits (`plan`'s committed tokens, then its queries) whose greedy
    tokens are its picks: the prediction of every target (`_targets`), then the queries after
    the first (the next drafts, used when every draft agrees)."""
    n_draft, n_commit, m = state.drafts, len(plan.commit), len(plan.queries)
    # Row of position q (predicting q + 1): the commit is [last verified, drafts...]; without
    # drafts the frontier's query, or (no queries: AR) the last committed row.
    first = n_commit - n_draft - 1 if n_draft or not m else n_commit
    return [*range(first, first + len(_targets(state))), *range(n_commit + 1, n_commit + m)]


def apply(
    state: DecodeState,
    plan: Plan,
    picks: list[list[int]],
    mask_id: int,
    propose: Callable[[DecodeState], list[int]] | None = None,
) -> tuple[list[int], int]:
    """Apply one forward's `picks` (the greedy tokens of its `rows`, read as lists) to `state`.

    `propose(state)`: the next drafts, for the positions from ``state.verified_end()`` on (an
    external draft model; called after every forward); None = the queries draft.
    Returns the positions it verified, in order, and how many of its commits were rejected
    (un-committed here; the caller drops that many entries from the end of its cache)."""
    n_draft, targets = state.drafts, _targets(state)
    greedy, drafted = picks[0][: len(targets)], picks[0][len(targets) :]
    start = targets.start
    n_ok = 0
    while n_ok < n_draft and greedy[n_ok] == state.canvas[start + n_ok]:
        n_ok += 1
    state.drafts = 0
    state.drafts_checked += n_draft
    state.drafts_accepted += n_ok
    verified = list(targets[: n_ok + 1])
    if n_ok < n_draft:  # reject the drafts from r = start + n_ok on
        r = start + n_ok
        state.uncommit(n_draft - n_ok)
        state.canvas[r] = greedy[n_ok]
        state.mask_again(list(range(r + 1, start + n_draft)), mask_id)
    elif n_ok < len(targets):  # the bonus: the prediction after the last draft
        state.accept(list(targets[n_ok:]), greedy[n_ok:])
    if propose is not None:  # the draft model, on the verified prefix
        tokens = propose(state)
        positions = list(range(state.verified_end(), state.verified_end() + len(tokens)))
    elif n_ok == n_draft and drafted:  # the first query is the bonus position
        positions = plan.queries[1:]
        tokens = draft(state, positions, drafted)
    else:  # this forward's queries saw a rejected draft
        return verified, n_draft - n_ok
    state.accept(positions, tokens)
    state.drafts = len(tokens)
    return verified, n_draft - n_ok
