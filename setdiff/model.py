"""The backbone: a compact Llama-style decoder, (tokens, positions, mask, cache) -> logits.

RMSNorm, rotary embeddings driven by explicit position ids, SwiGLU MLP and grouped-query
attention through `scaled_dot_product_attention` with boolean masks. Module and parameter names
follow Hugging Face `LlamaForCausalLM` (``model.layers.0.self_attn.q_proj.weight`` ...), so state
dicts move between the two formats without renaming.

The backbone knows nothing of paradigms, noise, orders or losses: the attention pattern comes in
as a boolean mask (True = may attend) and the positions as ids, which is all that set diffusion's
permuted two-copy layout needs.

Shapes: B batch, T new tokens, K keys (cache + new), H heads, G kv heads, E head dim, V vocab.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from setdiff.config import Positive, check, frozen
from setdiff.kv_cache import KVCache

Mask = Any
"""A boolean attention mask tensor (True = may attend), a FlexAttention BlockMask, or None."""


@frozen
class ModelConfig:
    """Backbone shape. Defaults are a ~0.6M-parameter model that trains in minutes on a CPU."""

    vocab_size: int
    """Embedding rows, including the special tokens (pad, bos, eos, mask)."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 2
    """Query heads."""
    n_kv_head: int = 1
    """Key/value heads (grouped-query attention); must divide n_head."""
    d_model: int = 128
    """Hidden size; head dim = d_model / n_head (64 in the presets, as vLLM's CPU kernels need)."""
    d_ff: int = 256
    """SwiGLU intermediate size."""
    max_seq_len: int = 512
    """Longest position id the model is used with (checked by the samplers)."""
    rope_theta: Positive = 10000.0
    """RoPE base."""
    norm_eps: Positive = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the input embedding with the output head."""
    head_dim_override: int | None = None
    """Per-head size when it is not d_model / n_head (Qwen3: 128 with d_model 1024, 16 heads)."""
    qk_norm: bool = False
    """RMSNorm every query and key head before RoPE (Qwen3's ``q_norm`` / ``k_norm``)."""
    attention_bias: bool = False
    """Biases on the q/k/v/o projections (HF Llama's ``attention_bias``)."""
    mlp_bias: bool = False
    """Biases on the MLP projections (HF Llama's ``mlp_bias``)."""
    norm: Literal["rms", "layer"] = "rms"
    """RMSNorm (Llama) or LayerNorm with a bias (GPT-2 / GPT-NeoX)."""
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    """Gated SiLU MLP (Llama) or a plain GELU MLP (GPT-2 / GPT-NeoX)."""
    learned_positions: bool = False
    """Add a learned absolute-position embedding to the token embedding (on top of RoPE)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        check(self.n_head % self.n_kv_head == 0, "n_kv_head must divide n_head")
        if self.head_dim_override is None:
            check(self.d_model % self.n_head == 0, "n_head must divide d_model")
        else:
            check(self.head_dim_override >= 1, "head_dim_override must be >= 1")
        check(self.head_dim % 2 == 0, f"head dim must be even for RoPE, got {self.head_dim}")
        check(self.norm in ("rms", "layer"), f"norm must be rms|layer, got {self.norm!r}")
        check(self.mlp in ("swiglu", "gelu"), f"mlp must be swiglu|gelu, got {self.mlp!r}")

    @property
    def head_dim(self) -> int:
        if self.head_dim_override is not None:
            return self.head_dim_override
        return self.d_model // self.n_head


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as HF Llama does; one fused op keeps small decode steps cheap.
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * y.to(x.dtype)


def make_norm(config: ModelConfig, dim: int) -> nn.Module:
    if config.norm == "layer":
        return nn.LayerNorm(dim, eps=config.norm_eps)
    return RMSNorm(dim, config.norm_eps)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """(E/2,) rotary frequencies, as HF Llama computes them."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for arbitrary (e.g. permuted) position ids, in HF Llama's half-split layout.

    Args:
        positions: (B, T) integer position ids.
        inv_freq: (E/2,) from `rope_inv_freq`.
    Returns:
        cos: (B, 1, T, E); sin: (B, 1, T, E) with its first half negated, so that HF's
        ``x * cos + rotate_half(x) * sin`` becomes ``x * cos + x.roll(E/2) * sin`` (one op less).
    """
    freqs = positions.float()[..., None] * inv_freq.float()  # (B, T, E/2), float32 as HF
    cos, sin = freqs.cos(), freqs.sin()
    return (
        torch.cat((cos, cos), dim=-1).to(dtype)[:, None],
        torch.cat((-sin, sin), dim=-1).to(dtype)[:, None],
    )


@functools.cache
def flex_attention(fused: bool) -> Any:
    """FlexAttention: compiled (`fused`) on CUDA, where the compiled kernel skips masked blocks;
    eager elsewhere. Eager FlexAttention is a reference implementation that materialises every
    score (O(T^2) memory), fine for the CPU equivalence tests, useless for speed."""
    from torch.nn.attention.flex_attention import flex_attention as eager

    return torch.compile(eager, dynamic=False) if fused else eager


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = (
            config.n_head,
            config.n_kv_head,
            config.head_dim,
        )
        q_dim, kv_dim = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.d_model, q_dim, bias=bias)
        self.k_proj = nn.Linear(config.d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(config.d_model, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, config.d_model, bias=bias)
        # Qwen3: per-head RMSNorm of queries and keys, before RoPE.
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Mask,
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q_BTHE = _linear(x, self.q_proj).view(B, T, self.n_head, self.head_dim)
        k_BTGE = _linear(x, self.k_proj).view(B, T, self.n_kv_head, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q_BTHE, k_BTGE = self.q_norm(q_BTHE), self.k_norm(k_BTGE)
        q_BHTE, k_BGTE = q_BTHE.transpose(1, 2), k_BTGE.transpose(1, 2)
        v_BTGE = _linear(x, self.v_proj).view(B, T, self.n_kv_head, self.head_dim)
        v_BGTE = v_BTGE.transpose(1, 2)
        q_BHTE, k_BGTE = apply_rope(q_BHTE, cos, sin), apply_rope(k_BGTE, cos, sin)
        if cache is not None:
            # Cached keys are post-RoPE at their true positions; the new ones are staged and only
            # kept if the caller commits them after the forward.
            k_BGTE, v_BGTE = cache.stage(self.layer, k_BGTE, v_BGTE)
        gqa = self.n_kv_head != self.n_head
        if mask is not None and not isinstance(mask, torch.Tensor):  # a FlexAttention BlockMask
            attend = flex_attention(fused=q_BHTE.is_cuda)
            y = attend(q_BHTE, k_BGTE, v_BGTE, block_mask=mask, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(
                q_BHTE, k_BGTE, v_BGTE, attn_mask=mask, enable_gqa=gqa
            )
        return _linear(y.transpose(1, 2).reshape(B, T, -1), self.o_proj)


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    # F.linear on the weights skips nn.Module dispatch, which matters for tiny decode steps.
    return F.linear(x, layer.weight, layer.bias)


class MLP(nn.Module):
    """SwiGLU (``gate_proj``, ``up_proj``, ``down_proj``) or GELU (``up_proj``, ``down_proj``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gated = config.mlp == "swiglu"
        if self.gated:
            self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=bias)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=bias)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = _linear(x, self.up_proj)
        hidden = F.silu(_linear(x, self.gate_proj)) * up if self.gated else F.gelu(up)
        return _linear(hidden, self.down_proj)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = make_norm(config, config.d_model)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = make_norm(config, config.d_model)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Mask,
        cache: KVCache | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embeddings, blocks and final norm (HF's ``LlamaModel``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        if config.learned_positions:
            self.embed_positions = nn.Embedding(config.max_seq_len, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = make_norm(config, config.d_model)


class Transformer(nn.Module):
    """Llama-style decoder with explicit positions, masks and an optional KV cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Not a parameter and not saved: derived from the config like HF's rotary embedding.
        self.register_buffer(
            "inv_freq", rope_inv_freq(config.head_dim, config.rope_theta), persistent=False
        )
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                # GPT-2 style scaled init of residual projections keeps early activations tame.
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: Mask = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits for every input token.

        Args:
            tokens: (B, T) token ids.
            positions: (B, T) or (T,) true position ids (RoPE).
            mask: boolean attention mask, True = may attend, broadcastable to (B, 1, T, K) where
                K = cache length + T; or a FlexAttention BlockMask (training without a cache).
                None = every query sees every key (a single query, or bidirectional attention
                without padding).
            cache: a `KVCache`; the new keys/values are staged and the caller decides how many to
                commit (`cache.commit(n)`) after the call.
        Returns:
            (B, T, V) float logits.
        """
        if positions.dim() == 1:
            positions = positions.expand(tokens.shape[0], -1)
        x = self.model.embed_tokens(tokens)
        if self.config.learned_positions:
            x = x + self.model.embed_positions(positions)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            mask = mask[None, None]
        elif isinstance(mask, torch.Tensor) and mask.dim() == 3:
            mask = mask[:, None]
        for block in self.model.layers:
            x = block(x, cos, sin, mask, cache)
        return F.linear(self.model.norm(x), self.lm_head.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
