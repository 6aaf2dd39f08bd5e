"""Attention masks as mask-mod factories, plus dense materializers.

A mask mod is a function ``(b, h, q_idx, kv_idx) -> bool tensor`` (FlexAttention's signature)
built from broadcastable integer index tensors, so the same rule gives a dense boolean matrix on
CPU (`materialize`) and a block mask under FlexAttention on GPU. True = the query may attend.

Training layouts (length L):
- causal: one copy, token q sees k <= q.
- bidirectional: one copy, everything sees everything (MDLM).
- two-copy ``[clean ; noisy]`` (length 2L, index a: copy = a >= L, rank r = a mod L):
  * set-causal (SetDLM, AO-GPT; ranks are positions in the sampled order):
      clean->clean  r_q >= r_k      the clean copy is a causal LM over the permuted sequence
      noisy->clean  r_q >  r_k      a query sees strictly earlier tokens, never its own label
      noisy->noisy  r_q == r_k      a [MASK] query sees only itself
      clean->noisy  never
  * block diffusion (BD3LM, block size S, natural order, block index b = r // S):
      clean->clean  b_q >= b_k      block-causal
      noisy->clean  b_q >  b_k      strictly earlier blocks
      noisy->noisy  b_q == b_k      bidirectional within the block
      clean->noisy  never
  With block size 1 the block-diffusion mask equals the set-causal mask (identity order).
  * shifted (``shift: true``; see `make_hidden_key_mask_mod`): either rule, except that a
    query whose input stands in for the clean token at position p - 1 does not also see that
    token's clean copy.

Decoding: `decode_mask` builds the rows of one sampler forward from commit groups; see there.
Shapes: Q queries, K keys, B batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
AttentionKind = Literal["sdpa", "flex"]
"""How training masks are handed to the backbone: a dense boolean tensor (SDPA, any device) or a
FlexAttention BlockMask (block-sparse kernels on GPU; an eager reference on CPU, used by the
CPU-equivalence tests)."""


def make_causal_mask_mod() -> MaskMod:
    def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q >= k

    return causal


def make_full_mask_mod() -> MaskMod:
    """Everything sees everything (MDLM's bidirectional attention)."""

    def full(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q >= 0) & (k >= 0)

    return full


def make_prompt_causal_mask_mod(
    context_len_B: torch.Tensor, open_BQK: torch.Tensor | None = None
) -> MaskMod:
    """Causal over each example's context (``context_len_B[b]`` leading positions: BOS and
    prompt), bidirectional over the rest (the answer canvas), which also sees the whole context.

    MDLM with ``causal_prompt: true``: the prompt is computed exactly as an AR model computes it
    (and could be cached once), the answer is one bidirectional block, as in BD3LM with a
    single block. With `open_BQK` ((B, n, n) bool; attention annealing) a canvas query sees a
    later canvas key only where ``open_BQK[b, q, k]``: all False = causal, all True = the
    bidirectional canvas."""

    def prompt_causal(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> torch.Tensor:
        c = context_len_B[b]
        canvas = (q >= c) & (k >= c)
        if open_BQK is not None:
            canvas = canvas & ((k <= q) | open_BQK[b, q, k])
        return (k <= q) | canvas

    return prompt_causal


def make_key_padding_mask_mod(base: MaskMod, valid_BK: torch.Tensor) -> MaskMod:
    """`base` AND key validity per example (``valid_BK[b, k]``)."""

    def key_padded(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> torch.Tensor:
        return base(b, h, q, k) & valid_BK[b, k]

    return key_padded


def make_set_causal_mask_mod(length: int) -> MaskMod:
    """Two-copy set-causal rule (see module docstring) for sequences of `length` L."""

    def set_causal(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> torch.Tensor:
        q_noisy, k_noisy = q >= length, k >= length
        r_q, r_k = q - length * q_noisy, k - length * k_noisy
        clean_clean = ~q_noisy & ~k_noisy & (r_q >= r_k)
        noisy_clean = q_noisy & ~k_noisy & (r_q > r_k)
        noisy_noisy = q_noisy & k_noisy & (r_q == r_k)
        return clean_clean | noisy_clean | noisy_noisy

    return set_causal


def make_block_diffusion_mask_mod(length: int, block_size: int) -> MaskMod:
    """Two-copy block-diffusion rule (see module docstring), blocks of `block_size` S."""

    def block_diffusion(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> torch.Tensor:
        q_noisy, k_noisy = q >= length, k >= length
        b_q = (q - length * q_noisy) // block_size
        b_k = (k - length * k_noisy) // block_size
        clean_clean = ~q_noisy & ~k_noisy & (b_q >= b_k)
        noisy_clean = q_noisy & ~k_noisy & (b_q > b_k)
        noisy_noisy = q_noisy & k_noisy & (b_q == b_k)
        return clean_clean | noisy_clean | noisy_noisy

    return block_diffusion


def make_hidden_key_mask_mod(base: MaskMod, hidden_BQ: torch.Tensor) -> MaskMod:
    """`base` with one key hidden per query (shifted queries, ``shift: true``).

    A shifted query predicting position p sits at position p - 1 and reads the token there
    when it is visible (AR's own computation at p - 1). That token's clean copy is then hidden
    from the query, which sees itself in its place: with every earlier token visible it attends
    exactly as AR's position p - 1 does.

    Args:
        hidden_BQ: (B, Q) long, per query index the key index it must not see (-1 = none).
    """

    def hidden(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return base(b, h, q, k) & (hidden_BQ[b, q] != k)

    return hidden


def materialize(mask_mod: MaskMod, n_q: int, n_k: int, device: str = "cpu") -> torch.Tensor:
    """Dense (Q, K) boolean matrix of a mask mod (for SDPA on CPU and for tests)."""
    q = torch.arange(n_q, device=device)[:, None]
    k = torch.arange(n_k, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(zero, zero, q, k).expand(n_q, n_k).clone()


def materialize_batched(mask_mod: MaskMod, batch: int, n: int, device: str = "cpu") -> torch.Tensor:
    """Dense (B, 1, n, n) boolean mask of a per-example mask mod."""
    b = torch.arange(batch, device=device)[:, None, None]
    q = torch.arange(n, device=device)[None, :, None]
    k = torch.arange(n, device=device)[None, None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(b, zero, q, k).expand(batch, n, n)[:, None]


def causal_mask(length: int) -> torch.Tensor:
    """(L, L) lower-triangular mask."""
    return materialize(make_causal_mask_mod(), length, length)


def set_causal_mask(length: int) -> torch.Tensor:
    """(2L, 2L) set-causal mask; rows/cols 0..L-1 = clean copy by rank, L..2L-1 = masked copy."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    return materialize(make_set_causal_mask_mod(length), 2 * length, 2 * length)


def block_diffusion_mask(length: int, block_size: int) -> torch.Tensor:
    """(2L, 2L) block-diffusion mask in the ``[clean ; noisy]`` layout, natural order."""
    if length < 1 or block_size < 1:
        raise ValueError(f"length and block_size must be >= 1, got {length}, {block_size}")
    return materialize(make_block_diffusion_mask_mod(length, block_size), 2 * length, 2 * length)


def training_mask(
    name: str,
    mask_mod: MaskMod,
    n: int,
    *,
    valid_BK: torch.Tensor | None = None,
    kind: AttentionKind = "sdpa",
    device: torch.device | str = "cpu",
) -> Any:
    """The (n, n) mask of one training forward, for SDPA (dense bool) or FlexAttention.

    `name` identifies `mask_mod` with its parameters (e.g. ``"block4"``): a mask without padding
    depends only on (name, n) and is built once per device and kind (never modify it in place).
    """
    if valid_BK is None:
        return _static_mask(name, mask_mod, n, kind, str(device))
    if kind == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        padded = make_key_padding_mask_mod(mask_mod, valid_BK)
        return create_block_mask(
            padded, B=valid_BK.shape[0], H=None, Q_LEN=n, KV_LEN=n, device=str(device)
        )
    return with_key_padding(_static_mask(name, mask_mod, n, "sdpa", str(device)), valid_BK)


_STATIC_MASKS: dict[tuple[str, int, str, str], Any] = {}


def _static_mask(name: str, mask_mod: MaskMod, n: int, kind: str, device: str) -> Any:
    key = (name, n, kind, device)
    if key not in _STATIC_MASKS:
        if kind == "flex":
            from torch.nn.attention.flex_attention import create_block_mask

            _STATIC_MASKS[key] = create_block_mask(
                mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=n, device=device
            )
        else:
            _STATIC_MASKS[key] = materialize(mask_mod, n, n, device)
    return _STATIC_MASKS[key]


def with_key_padding(mask_QK: torch.Tensor, valid_BK: torch.Tensor) -> torch.Tensor:
    """AND a static mask with per-example key validity: (B, 1, Q, K).

    Padding queries keep their rows (their outputs are ignored by the loss) but lose padding
    keys; every real row keeps at least its own key, so no row is empty and SDPA stays finite.
    """
    return mask_QK[None, None] & valid_BK[:, None, None, :]


def batched_training_mask(
    mask_mod: MaskMod, batch: int, n: int, *, kind: AttentionKind = "sdpa", device: Any = "cpu"
) -> Any:
    """The mask of one training forward whose rule differs per example (B, 1, n, n)."""
    if kind == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(mask_mod, B=batch, H=None, Q_LEN=n, KV_LEN=n, device=str(device))
    return materialize_batched(mask_mod, batch, n, str(device))


def decode_mask(groups: torch.Tensor, n_commit: int, query_attend: torch.Tensor) -> torch.Tensor:
    """Rows of one decoding forward over ``[committed ; queries]`` keys.

    The sampler's committed tokens form a causal stream in commit order, generalized with groups:
    committed token i sees committed token j iff ``groups[j] <= groups[i]`` (distinct increasing
    groups = causal, as in the set-causal clean copy; equal groups = one bidirectional block, as
    in BD3LM). Queries see every committed token and each other as `query_attend` says.

    Args:
        groups: (N,) groups of all committed tokens in commit order; the last `n_commit` are the
            ones being committed by this forward (the earlier ones may sit in a KV cache).
        n_commit: C, the committed tokens that are inputs of this forward.
        query_attend: (M, M) boolean, which query may see which query.
    Returns:
        (C + M, N + M) boolean mask: rows = the C new committed tokens then the M queries,
        columns = all N committed tokens then the M queries. With a KV cache the first N - C
        columns are the cache; without one, pass ``n_commit = N`` and feed everything.
    """
    n, m = groups.numel(), query_attend.shape[0]
    new_groups = groups[n - n_commit :]
    commit_rows = torch.cat(
        (groups[None, :] <= new_groups[:, None], query_attend.new_zeros(n_commit, m)), dim=1
    )
    query_rows = torch.cat((query_attend.new_ones(m, n), query_attend), dim=1)
    return torch.cat((commit_rows, query_rows), dim=0)
