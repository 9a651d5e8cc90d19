"""Pre-norm Transformer (RMSNorm, RoPE inside attention, GELU MLP) with pluggable attention per layer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.modules.base import (
    COMMON_STATS,
    AttentionConfig,
    AttentionContext,
    AttentionOutput,
    attn_flops_vs_dense,
)
from sparse_attn.modules.pattern_attention import DenseAttention
from sparse_attn.patterns import common


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Attributes:
      attention: one attention config for every layer, or a tuple with one per layer (any layer, any mechanism).
      num_classes: encoder only; size of the classification head.
    """

    vocab_size: int = 256
    model_dim: int = 128
    num_heads: int = 4
    num_layers: int = 2
    mlp_dim: int = 512
    attention: AttentionConfig | tuple[AttentionConfig, ...] = DenseAttention()
    num_classes: int = 2

    def layer_attention(self) -> tuple[AttentionConfig, ...]:
        att = self.attention if isinstance(self.attention, tuple) else (self.attention,) * self.num_layers
        if len(att) != self.num_layers:
            raise ValueError(f"{len(att)} attention configs for {self.num_layers} layers")
        return att


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelOutput:
    """logits; aux_loss: sum of every layer's weighted auxiliary losses; stats: per-layer scalars, named by
    `layer_stats` ("layer3/keys_per_query", "layer3/abca/anchors")."""

    logits: jax.Array
    aux_loss: jax.Array
    stats: dict


def layer_stats(i: int, attention: AttentionConfig, att: AttentionOutput, ctx: AttentionContext) -> dict:
    """Layer i's statistics and auxiliary losses under one naming scheme (docs/architecture.md, "Statistics"):
    the common statistics as `layer{i}/{key}`, everything else as `layer{i}/{mechanism}/{key}` (the config's
    `mechanism`; a config that declares none files them as `layer{i}/{key}`). Adds `attn_flops_vs_dense` from the
    module's `keys_per_query`, so that every mechanism is compared with dense attention on one convention."""
    mechanism = getattr(attention, "mechanism", None)
    own = f"layer{i}/{mechanism}/" if mechanism else f"layer{i}/"
    out = {}
    if "attn_flops_vs_dense" in att.stats:
        raise ValueError(f"layer {i} reports attn_flops_vs_dense itself: report keys_per_query, the model divides")
    for name, val in (*att.stats.items(), *att.aux_losses.items()):
        key = f"layer{i}/{name}" if name in COMMON_STATS else own + name
        if key in out:
            raise ValueError(f"layer {i} reports {key!r} twice (as a statistic and as an auxiliary loss)")
        out[key] = jax.lax.stop_gradient(val)
    if "keys_per_query" in att.stats:
        out[f"layer{i}/attn_flops_vs_dense"] = attn_flops_vs_dense(
            out[f"layer{i}/keys_per_query"], ctx.valid_len, causal=ctx.causal
        )
    return out


def shared_per_config(config: TransformerConfig, n: int, ctx: AttentionContext) -> dict:
    """`config.prepare(n, ctx, head_dim)` once per distinct layer config that defines it (equal configs share one):
    the patterns every such layer would otherwise rebuild, prepared for their executor, built once per forward."""
    shared = {}
    for attention in config.layer_attention():
        if hasattr(attention, "prepare") and attention not in shared:
            shared[attention] = attention.prepare(n, ctx, config.model_dim // config.num_heads)
    return shared


class Block(nnx.Module):
    def __init__(self, config: TransformerConfig, attention: AttentionConfig, *, rngs: nnx.Rngs):
        d = config.model_dim
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.attn = attention.make(d, config.num_heads, rngs=rngs)
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.mlp_in = nnx.Linear(d, config.mlp_dim, rngs=rngs)
        self.mlp_out = nnx.Linear(config.mlp_dim, d, rngs=rngs)

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> tuple[jax.Array, AttentionOutput]:
        att = self.attn(self.norm1(x_BxNxD), ctx)
        x = x_BxNxD + att.y
        x = x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x))))
        return x, att


def checked_inputs(tokens_BxN, valid_len_B, vocab_size: int) -> tuple[jax.Array, bool]:
    """(valid_len int32[B], whether the token ids were checked on the host). Token ids must be integers, and within
    [0, vocab) where concrete; `valid_len` an integer [B] within [0, N] (never truncated or wrapped)."""
    if tokens_BxN.ndim != 2 or not jnp.issubdtype(tokens_BxN.dtype, jnp.integer):
        raise ValueError(f"tokens must be integers [B, N], got {tokens_BxN.dtype}{tokens_BxN.shape}")
    b, n = tokens_BxN.shape
    known = common.is_concrete(tokens_BxN)
    if known and tokens_BxN.size:
        ids = common.host(tokens_BxN)
        low, high = int(np.min(ids)), int(np.max(ids))
        if low < 0 or high >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size}) (the vocabulary), got ids in [{low}, {high}]")
    if valid_len_B is None:
        return jnp.full((b,), n, jnp.int32), known
    valid_len = common.valid_len_array(valid_len_B, n)
    if valid_len.shape[0] != b:
        raise ValueError(f"valid_len has {valid_len.shape[0]} rows but tokens have batch {b}")
    return valid_len, known


class _Trunk(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.model_dim, rngs=rngs)
        self.blocks = nnx.List([Block(config, a, rngs=rngs) for a in config.layer_attention()])
        self.norm = nnx.RMSNorm(config.model_dim, rngs=rngs)

    def trunk(self, tokens_BxN, valid_len_B, step, causal: bool, embeddings=None):
        valid_len, known = checked_inputs(tokens_BxN, valid_len_B, self.config.vocab_size)
        ctx = AttentionContext(
            valid_len=valid_len, tokens=tokens_BxN, step=jnp.asarray(step, jnp.int32), causal=causal
        )
        if embeddings is None:
            x = self.embed(tokens_BxN)
            if not known:  # traced ids out of [0, vocab) turn their rows NaN (the loss guard stops on it)
                ok = (tokens_BxN >= 0) & (tokens_BxN < self.config.vocab_size)
                x = jnp.where(ok[..., None], x, jnp.nan)
        else:
            x = embeddings
        aux = jnp.zeros((), jnp.float32)
        stats = {}
        shared = shared_per_config(self.config, tokens_BxN.shape[1], ctx)
        for i, (block, attention) in enumerate(zip(self.blocks, self.config.layer_attention(), strict=True)):
            x, att = block(x, dataclasses.replace(ctx, shared=shared.get(attention)))
            for val in att.aux_losses.values():
                aux = aux + val
            stats.update(layer_stats(i, attention, att, ctx))
        return self.norm(x), aux, stats, valid_len


class TransformerLM(_Trunk):
    """Causal language model: tokens [B, N] -> next-token logits [B, N, vocab]."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.head = nnx.Linear(config.model_dim, config.vocab_size, rngs=rngs)

    def __call__(self, tokens_BxN, *, valid_len=None, step=0, embeddings=None) -> ModelOutput:
        """`embeddings` [B, N, D] replaces the token embeddings (tests differentiate through them)."""
        h, aux, stats, _ = self.trunk(tokens_BxN, valid_len, step, causal=True, embeddings=embeddings)
        return ModelOutput(logits=self.head(h), aux_loss=aux, stats=stats)


class TransformerClassifier(_Trunk):
    """Bidirectional encoder: tokens [B, N] -> class logits [B, num_classes] from the mean of valid tokens."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.head = nnx.Linear(config.model_dim, config.num_classes, rngs=rngs)

    def __call__(self, tokens_BxN, *, valid_len=None, step=0) -> ModelOutput:
        h, aux, stats, vl = self.trunk(tokens_BxN, valid_len, step, causal=False)
        n = tokens_BxN.shape[1]
        w_BxN = (jnp.arange(n)[None] < vl[:, None]).astype(h.dtype)
        pooled = jnp.einsum("bn,bnd->bd", w_BxN, h) / jnp.maximum(w_BxN.sum(-1, keepdims=True), 1.0)
        return ModelOutput(logits=self.head(pooled), aux_loss=aux, stats=stats)
