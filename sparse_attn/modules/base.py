"""The protocol every attention mechanism implements, the shared Q/K/V/O projections and the common statistics.

A mechanism is configured by a frozen dataclass with `make(model_dim, num_heads, *, rngs) -> nnx.Module` and a
`mechanism` class attribute naming it in statistics; the module is called as `module(x_BxNxD, ctx) -> AttentionOutput`.
Models hold a per-layer tuple of such configs, so a new mechanism plugs in without editing them
(docs/architecture.md, "One template per mechanism" and "Statistics").

A config may also define `prepare(n, ctx, head_dim) -> pytree`: what every layer of that config computes from the
context alone (a prepared pattern and its statistics). The model then calls it once per forward for each distinct
config and hands the result to every layer whose config is equal, as `ctx.shared` (docs/architecture.md, "Prepared
patterns").
"""

from __future__ import annotations

import dataclasses
import math
import functools
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn import registry
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
      shared: what the model built once with this layer's `config.prepare(n, ctx, head_dim)` for every layer of an
        equal config; None: the layer builds it itself.
    """

    valid_len: jax.Array
    tokens: jax.Array | None = None
    step: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))
    shared: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionOutput:
    """y: [B, N, model_dim]; aux_losses: weighted scalar losses added to the objective; stats: logged scalars.

    Keys of `aux_losses` and `stats` are unprefixed ("anchors", not "layer0/abca/anchors"): the model prefixes them
    in one place. Every module reports the common statistic `keys_per_query` (see `keys_per_query`).
    """

    y: jax.Array
    aux_losses: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)


class AttentionConfig(Protocol):
    mechanism: ClassVar[str]  # the name its statistics are filed under: "layer{i}/{mechanism}/{key}"

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module: ...


# Statistics every attention layer reports under `layer{i}/{key}` (docs/architecture.md, "Statistics"): the module
# reports `keys_per_query`; the model adds `attn_flops_vs_dense` on one convention for every mechanism.
COMMON_STATS = ("keys_per_query", "attn_flops_vs_dense")


def check_floats(config) -> None:
    """ValueError naming the field unless every float field of a config dataclass is finite and its `rope_base`
    (None: no RoPE) a number > 0: a NaN threshold or temperature would otherwise turn the logits NaN silently."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{type(config).__name__}.{field.name} must be a finite number, got {value!r}")
    base = getattr(config, "rope_base", None)
    if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0):
        raise ValueError(f"{type(config).__name__}.rope_base must be None (no RoPE) or a number > 0, got {base!r}")


def refuse_old_fields(instead_of: Callable[[str], str | None]):
    """A class decorator for a config whose fields were regrouped: `cls(old_name=...)` (and
    `dataclasses.replace(cfg, old_name=...)`) raises one TypeError naming, for each old field, `instead_of(name)`
    (None: not an old field)."""

    def decorate(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            old = [name for name in kwargs if instead_of(name)]
            if old:
                raise TypeError("; ".join(f"{cls.__name__} has no field {name!r}: use {instead_of(name)}"
                                          for name in old))
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        return cls

    return decorate


def build_module(config, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
    """The module of `config`'s mechanism record (`sparse_attn.registry`): a config knows nothing of its module, so
    config and module files import each other in one direction only."""
    return registry.for_config(config).module(config, model_dim, num_heads, rngs=rngs)


def keys_per_query(keys_BxHxN: jax.Array, valid_len_B: jax.Array) -> jax.Array:
    """float32: keys attended per query in this forward (self included when allowed), the mean over valid queries
    and heads. `keys_BxHxN` broadcasts over batch and heads ([B|1, H|1, N]); entries at padded queries are ignored.

    A mechanism with several attention passes (ABCA's handshake) counts the keys of every pass, so that
    `keys_per_query * sum(valid_len) * heads * 4 * head_dim` is its forward attention FLOPs.
    """
    vl = jnp.asarray(valid_len_B, jnp.int32).reshape(-1)
    keys = jnp.asarray(keys_BxHxN).astype(jnp.float32)
    n = keys.shape[-1]
    live = (jnp.arange(n)[None] < vl[:, None])[:, None, :]  # [B, 1, N]
    per_query = jnp.sum(jnp.where(live, keys, 0.0), axis=1) / keys.shape[1]  # mean over heads: [B, N]
    return jnp.sum(per_query) / jnp.maximum(jnp.sum(vl), 1).astype(jnp.float32)


def dense_keys_per_query(valid_len_B: jax.Array, *, causal: bool) -> jax.Array:
    """float32: `keys_per_query` of full attention on the same valid lengths: L bidirectional, (L + 1) / 2 causal
    (weighted by each sequence's valid queries)."""
    vl = jnp.asarray(valid_len_B, jnp.float32).reshape(-1)
    pairs = jnp.sum(vl * (vl + 1.0) / 2.0 if causal else vl * vl)
    return pairs / jnp.maximum(jnp.sum(vl), 1.0)


def attn_flops_vs_dense(keys_per_query_: jax.Array, valid_len_B: jax.Array, *, causal: bool) -> jax.Array:
    """float32: forward attention FLOPs relative to full attention (causal when the layer is) on the same valid
    lengths; equal to allowed pairs / dense pairs (0 when no token is valid)."""
    dense = dense_keys_per_query(valid_len_B, causal=causal)
    return jnp.where(dense > 0, keys_per_query_ / jnp.maximum(dense, 1e-9), 0.0).astype(jnp.float32)


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
