"""The fixed-pattern mechanisms: dense, local window, Longformer and BigBird (`modules.pattern_attention`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn import patterns
from sparse_attn.decode import baselines as decode
from sparse_attn.diagnostics.probe import pattern_probe
from sparse_attn.mechanisms.common import sized
from sparse_attn.modules import AttentionContext, BigBirdAttention, DenseAttention, LocalAttention, LongformerAttention
from sparse_attn.modules.pattern_attention import PatternAttention
from sparse_attn.registry import Decoder, Mechanism, Preset
from sparse_attn.studies.bench import with_pattern


def pattern_keys(config, n: int, tokens_BxN=None) -> float:
    """Keys per query of the layer's pattern on full length-n causal sequences, exactly (`pattern_stats`)."""
    ctx = AttentionContext(valid_len=jnp.full((1,), n, jnp.int32), causal=True)
    return float(patterns.pattern_stats(config.pattern(n, ctx), 1)["mean_keys"])


def bigbird_block(target: float) -> int:
    """BigBird's random key block under a budget: the largest power of two <= target / 4 (the random part stays a
    quarter of the budget; the window takes the rest)."""
    return 2 ** max(int(math.log2(max(target / 4, 1))), 0)


def _bigbird(radius: int, n: int, target: float | None) -> BigBirdAttention:
    block = min(32, n) if target is None else min(bigbird_block(target), n)
    return BigBirdAttention(radius=radius, num_global=1, num_random=1, block=block)


RECORD = Mechanism(
    name="fixed",
    configs=(DenseAttention, LocalAttention, LongformerAttention, BigBirdAttention),
    module=PatternAttention,
    presets={
        # the budget grids' reference: never matched
        "dense": Preset(config=lambda ctx: DenseAttention(implementation=ctx.implementation)),
        "local": sized(lambda r, n, t: LocalAttention(radius=r), "radius"),
        "longformer": sized(lambda r, n, t: LongformerAttention(radius=r, num_global=1), "radius"),
        "bigbird": sized(_bigbird, "radius", sized=("block",)),
    },
    decoder=Decoder(decode.init_cache, decode.step),
    probe=pattern_probe,
    keys_per_query=pattern_keys,
    bench={
        "dense_pattern": with_pattern(lambda s: patterns.dense(s.n)),
        "causal": with_pattern(lambda s: patterns.causal(s.n)),
        "window": with_pattern(lambda s: patterns.sliding_window(s.n, s.radius)),
        "causal_window": with_pattern(lambda s: patterns.sliding_window(s.n, s.radius, causal=True)),
        "longformer": with_pattern(lambda s: patterns.longformer(s.n, s.radius, 2)),
        "bigbird": with_pattern(lambda s: patterns.bigbird(s.n, s.radius, 2, 2, 64, jax.random.PRNGKey(1))),
    },
)
