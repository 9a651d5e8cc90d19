"""Attention over a fixed structural pattern: the dense, local, Longformer and BigBird baselines."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
from flax import nnx

from sparse_attn import patterns
from sparse_attn.attention import attention, prepare
from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections, check_floats, keys_per_query
from sparse_attn.patterns.stats import key_counts


@dataclasses.dataclass(frozen=True, kw_only=True)
class _PatternConfig:
    num_kv_heads: int | None = None
    implementation: str | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        check_floats(self)

    def pattern(self, n: int, ctx: AttentionContext):
        raise NotImplementedError

    def prepare(self, n: int, ctx: AttentionContext, head_dim: int) -> dict:
        """The pattern prepared for this config's executor and its `keys_per_query`: a pure function of the
        context, so the model builds it once for every layer with this config (`AttentionContext.shared`)."""
        pattern = self.pattern(n, ctx)
        keys, _ = key_counts(pattern)
        return {
            "pattern": prepare(pattern, implementation=self.implementation, head_dim=head_dim),
            "keys_per_query": jax.lax.stop_gradient(keys_per_query(keys, ctx.valid_len)),
        }

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> PatternAttention:
        return PatternAttention(self, model_dim, num_heads, rngs=rngs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseAttention(_PatternConfig):
    """Full attention (causal when the model is)."""

    mechanism: ClassVar[str] = "dense"

    def pattern(self, n, ctx):
        return patterns.dense(n, causal=ctx.causal, valid_len=ctx.valid_len)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalAttention(_PatternConfig):
    """Sliding window of `radius` tokens each side (causal: before)."""

    mechanism: ClassVar[str] = "local"

    radius: int = 64

    def pattern(self, n, ctx):
        return patterns.sliding_window(n, self.radius, causal=ctx.causal, valid_len=ctx.valid_len)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LongformerAttention(_PatternConfig):
    """Sliding window plus the first `num_global` tokens as global tokens."""

    mechanism: ClassVar[str] = "longformer"

    radius: int = 64
    num_global: int = 1

    def pattern(self, n, ctx):
        return patterns.longformer(n, self.radius, self.num_global, causal=ctx.causal, valid_len=ctx.valid_len)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BigBirdAttention(_PatternConfig):
    """Window + global + `num_random` random key blocks per query block, fixed per layer by `seed`."""

    mechanism: ClassVar[str] = "bigbird"

    radius: int = 64
    num_global: int = 1
    num_random: int = 2
    block: int = 64
    seed: int = 0

    def pattern(self, n, ctx):
        return patterns.bigbird(
            n,
            self.radius,
            self.num_global,
            self.num_random,
            min(self.block, n),
            jax.random.PRNGKey(self.seed),
            causal=ctx.causal,
            valid_len=ctx.valid_len,
        )


class PatternAttention(nnx.Module):
    """Projections -> sparse attention over `config.pattern(n, ctx)` -> output projection; reports the common
    statistic `keys_per_query` of the pattern (no mechanism-specific ones). The prepared pattern comes from the
    model (`ctx.shared`, built once for every layer of an equal config) or is built here."""

    def __init__(self, config: _PatternConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        q, k, v = self.proj.qkv(x_BxNxD)
        shared = ctx.shared
        if shared is None:
            shared = self.config.prepare(x_BxNxD.shape[1], ctx, q.shape[-1])
        o = attention(q, k, v, shared["pattern"])
        return AttentionOutput(y=self.proj.out(o), stats={"keys_per_query": shared["keys_per_query"]})
