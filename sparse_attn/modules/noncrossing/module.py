"""NoncrossingAttention (NNX): projections -> pair scorer -> the non-crossing core -> output projection."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.noncrossing import core as nc_core
from sparse_attn.modules.noncrossing.config import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.scorer import PairScorer
from sparse_attn.modules.noncrossing.stats import noncrossing_stats
from sparse_attn.patterns.neighbours import NeighbourList


class NoncrossingAttention(nnx.Module):
    """Projections -> router -> TL diagram per head -> key rows -> sparse attention -> output projection.

    Bidirectional only: the router reads both ends of every pair and the local-max choice reads later pairs.
    """

    def __init__(self, config: NoncrossingAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        sides = 2 if config.doubled else 0
        self.scorer = (
            PairScorer(model_dim, num_heads, config.num_route_layers, config.router_dim, sides=sides, rngs=rngs)
            if config.router != "brick_wall"
            else None
        )
        d, e = self.proj.head_dim, config.edge_mlp_dim
        self.edge_w1 = nnx.Param(jax.random.normal(rngs.params(), (num_heads, d, e)) / math.sqrt(d)) if e else None
        self.edge_w2 = nnx.Param(jax.random.normal(rngs.params(), (num_heads, e)) / math.sqrt(e)) if e else None

    def router_inputs(self, x_BxNxD: jax.Array) -> nc_core.RouterInputs | None:
        """The pair scorer's features of `x` (padded positions already 0) and its weights; None for the brick wall."""
        if self.scorer is None:
            return None
        sc = self.scorer
        u, v = sc.half_point_features(x_BxNxD) if self.config.doubled else sc.features(x_BxNxD)
        return nc_core.RouterInputs(u, v, sc.w[...], sc.c[...], sc.beta[...])

    def _edge(self) -> nc_core.EdgeMLP | None:
        return None if self.edge_w1 is None else nc_core.EdgeMLP(self.edge_w1[...], self.edge_w2[...])

    def route(self, x_BxNxD: jax.Array, valid_len_B: jax.Array) -> dict:
        """Per (batch, head) diagrams and router outputs, stacked [B, H, ...] (for figures and tests)."""
        b, n, _ = x_BxNxD.shape
        ri = self.router_inputs(x_BxNxD)
        return nc_core.route(self.config, ri, valid_len_B, batch=b, n=n, heads=self.proj.num_heads)

    def pattern(self, routed: dict, valid_len_B: jax.Array) -> NeighbourList:
        """The neighbour list [B, H, N, K] of `route`'s diagrams, creator gates as slot biases."""
        ri = None
        if self.scorer is not None:
            sc = self.scorer
            ri = nc_core.RouterInputs(routed["u"], routed["v"], sc.w[...], sc.c[...], sc.beta[...])
        return nc_core.key_row_pattern(self.config, routed, ri, valid_len_B)

    def core(self, x_BxNxD, q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, valid_len_B) -> tuple[jax.Array, dict]:
        """Everything from hidden states and projected q, k, v to o [B, N, H, D] and the layer's statistics
        (router features, diagrams, key rows, attention; the Q/K/V/O projections excluded)."""
        b, n = x_BxNxD.shape[:2]
        valid_len_B = nc_core.checked_valid_len(valid_len_B, b, n)
        live = jnp.arange(n)[None, :, None] < valid_len_B[:, None, None]
        x_BxNxD = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
        o, aux = nc_core.noncrossing_core(
            q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, self.router_inputs(x_BxNxD), valid_len_B, self.config, edge=self._edge()
        )
        return o, noncrossing_stats(aux["routed"], aux["rows"], valid_len_B)

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        if ctx.causal:
            raise ValueError(
                "NoncrossingAttention is bidirectional: the router reads both ends of every pair, and the "
                "local-max choice reads later pairs; use it in encoders (causal=False)"
            )
        b, n = x_BxNxD.shape[:2]
        valid_len = nc_core.checked_valid_len(ctx.valid_len, b, n)
        # Padded hidden states may hold anything: select them away before the projections, whose weight gradients
        # (x^T dq) would otherwise multiply them.
        x_BxNxD = jnp.where(jnp.arange(n)[None, :, None] < valid_len[:, None, None], x_BxNxD, 0.0).astype(x_BxNxD.dtype)
        q, k, v = self.proj.qkv(x_BxNxD)
        o, st = self.core(x_BxNxD, q, k, v, valid_len)
        return AttentionOutput(y=self.proj.out(o), stats=jax.tree.map(jax.lax.stop_gradient, st))

