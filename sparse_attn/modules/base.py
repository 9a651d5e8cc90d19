"""The protocol every attention mechanism implements, and the shared Q/K/V/O projections.

A mechanism is configured by a frozen dataclass with `make(model_dim, num_heads, *, rngs) -> nnx.Module`; the module
is called as `module(x_BxNxD, ctx) -> AttentionOutput`. Models hold a per-layer tuple of such configs, so a new
mechanism plugs in without editing them.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.rope import apply_rope


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionContext:
    """What a layer knows besides its hidden states.

    Attributes:
      valid_len: int32[B] tokens at or after it are padding.
      tokens: int32[B, N] input token ids (explicit anchors read them), or None.
      step: int32[] training step (phase and temperature schedules read it).
      causal: static; no output may depend on a later token.
    """

    valid_len: jax.Array
    tokens: jax.Array | None = None
    step: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionOutput:
    """y: [B, N, model_dim]; aux_losses: weighted scalar losses added to the objective; stats: logged scalars."""

    y: jax.Array
    aux_losses: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)


class AttentionConfig(Protocol):
    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module: ...


class Projections(nnx.Module):
    """Q/K/V/O projections with GQA and RoPE, shared by every mechanism.

    `qkv(x)` returns q [B, N, H, D], k and v [B, N, G, D]; `out(o)` maps [B, N, H, D] back to [B, N, model_dim].
    """

    def __init__(
        self,
        model_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        rope_base: float | None = 10_000.0,
        rngs: nnx.Rngs,
    ):
        if model_dim % num_heads:
            raise ValueError(f"model_dim ({model_dim}) must be divisible by num_heads ({num_heads})")
        g = num_kv_heads or num_heads
        if num_heads % g:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({g})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, g, model_dim // num_heads
        self.rope_base = rope_base
        init = nnx.initializers.lecun_normal()
        self.wq = nnx.Linear(model_dim, num_heads * self.head_dim, use_bias=False, kernel_init=init, rngs=rngs)
        self.wk = nnx.Linear(model_dim, g * self.head_dim, use_bias=False, kernel_init=init, rngs=rngs)
        self.wv = nnx.Linear(model_dim, g * self.head_dim, use_bias=False, kernel_init=init, rngs=rngs)
        self.wo = nnx.Linear(num_heads * self.head_dim, model_dim, use_bias=False, kernel_init=init, rngs=rngs)

    def qkv(self, x_BxNxD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        b, n, _ = x_BxNxD.shape
        q = self.wq(x_BxNxD).reshape(b, n, self.num_heads, self.head_dim)
        k = self.wk(x_BxNxD).reshape(b, n, self.num_kv_heads, self.head_dim)
        v = self.wv(x_BxNxD).reshape(b, n, self.num_kv_heads, self.head_dim)
        if self.rope_base is not None:
            pos = jnp.arange(n, dtype=jnp.int32)[None]
            q, k = apply_rope(q, pos, self.rope_base), apply_rope(k, pos, self.rope_base)
        return q, k, v

    def out(self, o_BxNxHxD: jax.Array) -> jax.Array:
        b, n = o_BxNxHxD.shape[:2]
        return self.wo(o_BxNxHxD.reshape(b, n, -1))
