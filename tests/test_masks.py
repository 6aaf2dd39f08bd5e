"""Attention masks against brute-force references written from the rule tables (spec 4.1, 4.4)."""

from __future__ import annotations

import itertools

import pytest
import torch

from setdiff.masks import (
    block_diffusion_mask,
    causal_mask,
    decode_mask,
    set_causal_mask,
    with_key_padding,
)

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [1, 2, 3, 5, 8, 13]


def ref_set_causal(L: int) -> torch.Tensor:
    """Spec 4.1: copy(a) = clean if a < L else noisy; rank r(a) = a mod L."""
    out = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for q in range(2 * L):
        for k in range(2 * L):
            q_clean, k_clean = q < L, k < L
            rq, rk = q % L, k % L
            if q_clean and k_clean:
                allowed = rq >= rk  # rule 1: causal, self included
            elif not q_clean and k_clean:
                allowed = rq > rk  # rule 2: strictly earlier clean tokens
            elif not q_clean and not k_clean:
                allowed = rq == rk  # rule 3: a mask query sees only itself
            else:
                allowed = False  # rule 4: clean never sees noisy
            out[q, k] = allowed
    return out


def ref_block_diffusion(L: int, S: int) -> torch.Tensor:
    """BD3LM contrast of spec 4.1: blocks of S in natural order (last block may be short)."""
    out = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for q in range(2 * L):
        for k in range(2 * L):
            q_clean, k_clean = q < L, k < L
            bq, bk = (q % L) // S, (k % L) // S
            if q_clean and k_clean:
                allowed = bq >= bk
            elif not q_clean and k_clean:
                allowed = bq > bk
            elif not q_clean and not k_clean:
                allowed = bq == bk
            else:
                allowed = False
            out[q, k] = allowed
    return out


def ref_causal(L: int) -> torch.Tensor:
    return torch.tensor([[k <= q for k in range(L)] for q in range(L)], dtype=torch.bool)


@pytest.mark.parametrize("L", LENGTHS)
def test_set_causal_mask_matches_rule_table(L: int) -> None:
    got = set_causal_mask(L)
    assert got.dtype == torch.bool and got.shape == (2 * L, 2 * L)
    assert torch.equal(got, ref_set_causal(L))


@pytest.mark.parametrize("L", LENGTHS)
def test_set_causal_blocks(L: int) -> None:
    m = set_causal_mask(L)
    clean_clean, clean_noisy = m[:L, :L], m[:L, L:]
    noisy_clean, noisy_noisy = m[L:, :L], m[L:, L:]
    assert torch.equal(clean_clean, ref_causal(L))  # clean half = a causal LM mask
    assert torch.equal(clean_clean, causal_mask(L))
    assert not clean_noisy.any()
    assert torch.equal(noisy_clean, torch.ones(L, L, dtype=torch.bool).tril(-1))
    assert torch.equal(noisy_noisy, torch.eye(L, dtype=torch.bool))
    # Pitfall 3: a noisy query must never see its own clean token (label leak).
    assert not noisy_clean.diagonal().any()
    # No empty rows (SDPA would produce NaN).
    assert m.any(-1).all()


@pytest.mark.parametrize(
    ("L", "S"),
    [(1, 1), (4, 1), (4, 2), (4, 4), (7, 2), (7, 3), (8, 3), (10, 4), (5, 8), (12, 5), (9, 9)],
)
def test_block_diffusion_mask_matches_rule_table(L: int, S: int) -> None:
    got = block_diffusion_mask(L, S)
    assert got.shape == (2 * L, 2 * L)
    assert torch.equal(got, ref_block_diffusion(L, S))


@pytest.mark.parametrize(("L", "S"), [(7, 3), (8, 4), (10, 4)])
def test_block_diffusion_blocks(L: int, S: int) -> None:
    m = block_diffusion_mask(L, S)
    blk = torch.arange(L) // S
    same = blk[:, None] == blk[None, :]
    assert torch.equal(m[:L, :L], blk[:, None] >= blk[None, :])  # block-causal clean copy
    assert torch.equal(m[L:, L:], same)  # bidirectional inside a block
    assert torch.equal(m[L:, :L], blk[:, None] > blk[None, :])  # strictly earlier blocks
    assert not m[:L, L:].any()


@pytest.mark.parametrize("L", LENGTHS)
def test_block_size_one_is_set_causal(L: int) -> None:
    assert torch.equal(block_diffusion_mask(L, 1), set_causal_mask(L))
    assert torch.equal(block_diffusion_mask(L, 1)[:L, :L], ref_causal(L))


def test_block_size_ge_length_is_one_block() -> None:
    L = 6
    m = block_diffusion_mask(L, L)
    assert m[:L, :L].all() and m[L:, L:].all() and not m[L:, :L].any() and not m[:L, L:].any()


@pytest.mark.parametrize("bad", [(0, 1), (-1, 2), (4, 0)])
def test_mask_builders_reject_bad_sizes(bad: tuple[int, int]) -> None:
    L, S = bad
    with pytest.raises(ValueError):
        block_diffusion_mask(L, S)
    if L < 1:
        with pytest.raises(ValueError):
            set_causal_mask(L)


def test_with_key_padding() -> None:
    L = 5
    base = set_causal_mask(L)
    valid = torch.tensor(
        [[True] * 5 + [True] * 5, [True] * 3 + [False] * 2 + [True] * 3 + [False] * 2]
    )
    got = with_key_padding(base, valid)
    assert got.shape == (2, 1, 2 * L, 2 * L)
    for b in range(2):
        for q in range(2 * L):
            for k in range(2 * L):
                assert bool(got[b, 0, q, k]) == (bool(base[q, k]) and bool(valid[b, k]))


# ---------------------------------------------------------------------------------------------
# decode_mask


def ref_decode_mask(groups: list[int], n_commit: int, query_attend: torch.Tensor) -> torch.Tensor:
    """Spec 4.4 generalized with groups, written as explicit loops."""
    n, m = len(groups), query_attend.shape[0]
    out = torch.zeros(n_commit + m, n + m, dtype=torch.bool)
    for row in range(n_commit):
        i = n - n_commit + row  # index of this committed token in commit order
        for j in range(n):
            out[row, j] = groups[j] <= groups[i]
        # committed tokens never see queries
    for qi in range(m):
        row = n_commit + qi
        for j in range(n):
            out[row, j] = True
        for qj in range(m):
            out[row, n + qj] = bool(query_attend[qi, qj])
    return out


DECODE_CASES = [
    ([0, 1, 2, 3], 4, 2),  # no cache: all committed fed again, causal
    ([0, 1, 2, 3, 4], 2, 3),  # cache of 3, two new causal commits, three queries
    ([0, 0, 0, 1, 1, 1, 2], 4, 2),  # block groups, commit straddles blocks
    ([5, 6, 7], 0, 4),  # only queries (first step after prefill)
    ([0, 1], 2, 0),  # prefill, no queries
    ([], 0, 3),  # nothing committed (mdlm)
    ([0, 0, 1, 1, 2, 2, 3], 7, 1),
]


@pytest.mark.parametrize(("groups", "n_commit", "m"), DECODE_CASES)
@pytest.mark.parametrize("attend", ["eye", "ones", "random"])
def test_decode_mask_matches_loop_reference(
    groups: list[int], n_commit: int, m: int, attend: str
) -> None:
    g = torch.Generator().manual_seed(len(groups) * 7 + n_commit + m)
    if attend == "eye":
        qa = torch.eye(m, dtype=torch.bool)
    elif attend == "ones":
        qa = torch.ones(m, m, dtype=torch.bool)
    else:
        qa = torch.rand(m, m, generator=g) < 0.5
    got = decode_mask(torch.tensor(groups, dtype=torch.long), n_commit, qa)
    assert got.dtype == torch.bool
    assert torch.equal(got, ref_decode_mask(groups, n_commit, qa))


@pytest.mark.parametrize("N", [1, 3, 6])
def test_decode_mask_is_set_causal_restricted(N: int) -> None:
    """Committed ranks 0..N-1 (distinct groups) + one query at rank N = rows of the training mask.

    Committed rows = clean rows 0..N-1 over clean keys 0..N-1; the query row = noisy row N over
    clean keys 0..N-1 and itself (spec 4.4: "exactly rules 1-3 with rank = commit order").
    """
    L = N + 1
    train = set_causal_mask(L)
    got = decode_mask(torch.arange(N), N, torch.eye(1, dtype=torch.bool))
    assert torch.equal(got[:N, :N], train[:N, :N])
    assert not got[:N, N:].any()
    assert torch.equal(got[N, :N], train[L + N, :N])
    assert bool(got[N, N]) == bool(train[L + N, L + N])


def test_decode_mask_cached_rows_equal_uncached_rows() -> None:
    """The rows fed with a cache are the trailing rows/columns of the full (no-cache) mask."""
    groups = torch.tensor([0, 1, 2, 2, 3, 4, 5])
    qa = torch.eye(3, dtype=torch.bool)
    full = decode_mask(groups, 7, qa)
    for n_cached in range(7):
        n_commit = 7 - n_cached
        cached = decode_mask(groups, n_commit, qa)
        assert torch.equal(cached, full[n_cached:])
    # Dropping the oldest entries (overflow) = slicing the groups from the left.
    for drop in range(1, 5):
        sub = decode_mask(groups[drop:], 2, qa)
        assert torch.equal(sub, full[5:, drop:])


def test_all_true_masks_are_exhaustive() -> None:
    """Every (q, k) pair in a tiny case gets the value of its rule (cross-check of the loops)."""
    L = 3
    m = set_causal_mask(L)
    expected_true = {
        (q, k)
        for q, k in itertools.product(range(2 * L), repeat=2)
        if (q < L and k < L and k <= q)
        or (q >= L and k < L and k < q - L)
        or (q >= L and k >= L and q == k)
    }
    got_true = {(int(q), int(k)) for q, k in m.nonzero()}
    assert got_true == expected_true
