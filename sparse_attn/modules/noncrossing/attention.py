"""NoncrossingAttention: non-crossing (Temperley–Lieb) routing attention (seed 002, SPEC §3, math_spec part A).

Per head a router builds a TL diagram from the hidden states; each query attends its key row
``[self, top partner, (bottom partner)]`` (K <= 3) with the creator gate ``log σ(score)`` added to each routed
arc's logit, so the router learns through the attention loss. The model adds the residual.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.attention import attention
from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.noncrossing import routers
from sparse_attn.modules.noncrossing.scorer import PairScorer
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.noncrossing import key_rows, stats

ROUTERS = ("defect_pair", "brick_wall", "adjacent_topk")
ROWS = ("self_top_bottom", "self_top", "through")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoncrossingAttentionConfig:
    """Attributes:
    router: "defect_pair" (default, §A4.3), "brick_wall" (fixed, no parameters) or "adjacent_topk" (ablation).
    num_route_layers: T routing layers (defect-pair brackets nest up to depth T; brick-wall depth).
    router_dim: hidden width r of the pair MLP.
    tau: local-max threshold on scores (a pair needs s > tau).
    doubled: route in TL_{2n} with two half-points per token, so unmatched tokens can sit inside brackets.
    rows: "self_top_bottom" (default K=3), "self_top" (K=2) or "through" (seed-literal ablation; sigmoid gate).
    topk_fraction: adjacent_topk keeps at most ceil(fraction * n) generators per layer.
    brick_start: "even" or "odd" first brick-wall layer.
    creator_gate: add log σ(creator score) to routed arcs' logits.
    edge_mlp_dim: if set, logits come from a small MLP on q_a ⊙ k_b instead of the scaled dot product.
    """

    router: str = "defect_pair"
    num_route_layers: int = 4
    router_dim: int = 8
    tau: float = 0.0
    doubled: bool = False
    rows: str = "self_top_bottom"
    topk_fraction: float = 0.25
    brick_start: str = "even"
    creator_gate: bool = True
    edge_mlp_dim: int | None = None
    num_kv_heads: int | None = None
    implementation: str | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {self.rows!r}")
        if self.num_route_layers < 1 or self.router_dim < 1:
            raise ValueError("num_route_layers and router_dim must be >= 1")
        if self.doubled and (self.router != "defect_pair" or self.rows != "self_top_bottom"):
            raise ValueError("doubled=True needs router='defect_pair' and rows='self_top_bottom' (its rows are K=3)")
        if not 0.0 < self.topk_fraction <= 1.0:
            raise ValueError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")
        if self.brick_start not in ("even", "odd"):
            raise ValueError(f"brick_start must be 'even' or 'odd', got {self.brick_start!r}")

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> "NoncrossingAttention":
        return NoncrossingAttention(self, model_dim, num_heads, rngs=rngs)


def checked_valid_len(valid_len, batch: int, n: int) -> jax.Array:
    """int32[B] valid lengths: a concrete value outside [0, n] is a ValueError; a traced one (inside jit) is clamped
    to [0, n] (a sequence cannot have more real tokens than positions)."""
    vl = jnp.broadcast_to(jnp.asarray(valid_len, jnp.int32), (batch,))
    try:
        host = np.asarray(valid_len)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        host = None
    if host is not None and (np.any(host > n) or np.any(host < 0)):
        raise ValueError(f"valid_len {host.tolist()} must lie in [0, {n}] (the sequence length)")
    return jnp.clip(vl, 0, n)


class NoncrossingAttention(nnx.Module):
    """Projections -> router -> TL diagram per head -> key rows -> sparse attention -> output projection."""

    def __init__(self, config: NoncrossingAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        routed = config.router != "brick_wall"
        self.scorer = (
            PairScorer(
                model_dim,
                num_heads,
                config.num_route_layers,
                config.router_dim,
                sides=2 if config.doubled else 0,
                rngs=rngs,
            )
            if routed
            else None
        )
        d, e = self.proj.head_dim, config.edge_mlp_dim
        self.edge_w1 = nnx.Param(jax.random.normal(rngs.params(), (num_heads, d, e)) / math.sqrt(d)) if e else None
        self.edge_w2 = nnx.Param(jax.random.normal(rngs.params(), (num_heads, e)) / math.sqrt(e)) if e else None

    def route(self, x_BxNxD: jax.Array, valid_len_B: jax.Array) -> dict:
        """Per (batch, head) diagrams and router outputs, stacked [B, H, ...]."""
        cfg = self.config
        b, n, _ = x_BxNxD.shape
        h = self.proj.num_heads
        if cfg.router == "brick_wall":
            r = routers.brick_wall_router(n, cfg.num_route_layers, cfg.brick_start)
            return jax.tree.map(lambda a: jnp.broadcast_to(a, (b, h) + a.shape), r)
        if cfg.doubled:
            u, v = self.scorer.half_point_features(x_BxNxD)
            limit_B = 2 * valid_len_B
        else:
            u, v = self.scorer.features(x_BxNxD)
            limit_B = valid_len_B
        w, c, beta = self.scorer.w[...], self.scorer.c[...], self.scorer.beta[...]
        sg = jax.lax.stop_gradient  # the construction is discrete; gates are recomputed differentiably in pattern()
        if cfg.router == "defect_pair":
            fn = lambda u1, v1, w1, c1, b1, lim: routers.defect_pair_router(u1, v1, w1, c1, b1, lim, tau=cfg.tau)  # noqa: E731
        else:
            k = max(1, math.ceil(cfg.topk_fraction * n))
            fn = lambda u1, v1, w1, c1, b1, lim: routers.adjacent_router(u1, v1, w1, c1, b1, lim, tau=cfg.tau, k=k)  # noqa: E731
        per_head = jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, None))
        routed = jax.vmap(per_head, in_axes=(0, 0, None, None, None, 0))(sg(u), sg(v), sg(w), sg(c), sg(beta), limit_B)
        return dict(routed, u=u, v=v)

    def pattern(self, routed: dict, valid_len_B: jax.Array) -> NeighbourList:
        """The neighbour list [B, H, N, K] of the routed diagrams, creator gates as slot biases."""
        cfg = self.config
        if cfg.doubled:
            rows_fn = key_rows.doubled_rows
        elif cfg.rows == "through":
            rows_fn = key_rows.through_rows
        else:
            rows_fn = lambda p: key_rows.key_rows(p, cup_slot=cfg.rows == "self_top_bottom")  # noqa: E731

        def rows(p, vl):
            idx, valid, src = rows_fn(p)
            return idx, key_rows.mask_keys(idx, valid, vl), src

        idx, valid, src = jax.vmap(jax.vmap(rows, in_axes=(0, None)))(routed["p"], valid_len_B)
        if not cfg.creator_gate or cfg.router == "brick_wall":
            return NeighbourList(idx=idx, valid=valid)
        sc = self.scorer
        gate = jax.vmap(routers.creator_gate, in_axes=(0, 0, 0, 0, 0, 0, 0))  # heads
        gate = jax.vmap(gate, in_axes=(0, 0, 0, 0, None, None, None))  # batch
        gate_BxHx2M = gate(
            routed["creator"], routed["right"], routed["u"], routed["v"], sc.w[...], sc.c[...], sc.beta[...]
        )
        bias = jax.vmap(jax.vmap(key_rows.row_bias))(gate_BxHx2M, src)
        return NeighbourList(idx=idx, valid=valid, bias=bias)

    def core(self, x_BxNxD, q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, valid_len_B) -> tuple[jax.Array, dict]:
        """The attention core (router, diagrams, key rows, attention): o [B, N, H, D] and statistics.

        Padded positions may hold anything (NaN included): they are selected to 0 in x, q, k, v, padded query rows
        output 0, and every masked slot of a row is pointed at the row itself, so that whatever an executor does
        with a masked slot it reads nothing the row may not read.
        """
        b, n = x_BxNxD.shape[:2]
        valid_len_B = checked_valid_len(valid_len_B, b, n)
        live = jnp.arange(n)[None, :] < valid_len_B[:, None]  # [B, N]
        zero_pad = lambda a: jnp.where(live.reshape(live.shape + (1,) * (a.ndim - 2)), a, jnp.zeros((), a.dtype))
        x_BxNxD, q_BxNxHxD, k_BxNxGxD, v_BxNxGxD = map(zero_pad, (x_BxNxD, q_BxNxHxD, k_BxNxGxD, v_BxNxGxD))
        routed = self.route(x_BxNxD, valid_len_B)
        nl = self.pattern(routed, valid_len_B)
        own = jnp.arange(n, dtype=nl.idx.dtype)[None, None, :, None]
        nl = dataclasses.replace(nl, idx=jnp.where(nl.valid, nl.idx, own))
        if self.edge_w1 is not None:
            o = self._edge_mlp_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, nl)
        elif self.config.rows == "through":
            o = attention(
                q_BxNxHxD,
                k_BxNxGxD,
                v_BxNxGxD,
                NeighbourList(nl.idx, nl.valid),
                implementation=self.config.implementation,
            )
            if nl.bias is not None:  # a softmax over one key is 1: gate the single arc by σ(score) instead
                o = o * jnp.exp(nl.bias[..., 0]).transpose(0, 2, 1)[..., None].astype(o.dtype)
        else:
            o = attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, nl, implementation=self.config.implementation)
        return jnp.where(live[..., None, None], o, jnp.zeros((), o.dtype)), self._stats(routed, nl)

    def _edge_mlp_attention(self, q, k, v, nl: NeighbourList):
        b, n, h, d = q.shape
        g = k.shape[2]
        grp = jnp.arange(h) // (h // g)
        bi = jnp.arange(b).reshape(b, 1, 1, 1)
        kg = k[bi, nl.idx, grp.reshape(1, h, 1, 1)]  # [B, H, N, K, D]
        vg = v[bi, nl.idx, grp.reshape(1, h, 1, 1)]
        qk = q.transpose(0, 2, 1, 3)[:, :, :, None] * kg
        hid = jax.nn.gelu(jnp.einsum("bhnkd,hde->bhnke", qk.astype(jnp.float32), self.edge_w1[...]))
        s = jnp.einsum("bhnke,he->bhnk", hid, self.edge_w2[...])
        if nl.bias is not None:
            s = s + nl.bias
        p, _ = masked_softmax(s, nl.valid)
        o = jnp.einsum("bhnk,bhnkd->bnhd", p, vg.astype(jnp.float32))
        return o.astype(q.dtype)

    def _stats(self, routed: dict, nl: NeighbourList) -> dict:
        ds = jax.vmap(jax.vmap(stats.diagram_stats))(routed["p"])
        arcs = jax.vmap(jax.vmap(stats.surviving_arcs))(nl.idx, nl.valid)
        f32 = lambda a: jnp.mean(a.astype(jnp.float32))  # noqa: E731
        return dict(
            arcs=f32(arcs),
            rank=f32(ds["rank"]),
            loops=f32(routed["loops"]),
            word_length=f32(routed["word_length"]),
            pairs=f32(routed["pairs"]),
            nesting_depth=jnp.max(ds["nesting_depth"]).astype(jnp.float32),
        )

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        if ctx.causal:
            raise ValueError(
                "NoncrossingAttention is bidirectional: the router reads both ends of every pair, and the "
                "local-max choice reads later pairs; use it in encoders (causal=False)"
            )
        b, n = x_BxNxD.shape[:2]
        valid_len = checked_valid_len(ctx.valid_len, b, n)
        # Padded hidden states may hold anything: select them away before the projections, whose weight gradients
        # (x^T dq) would otherwise multiply them.
        x_BxNxD = jnp.where(jnp.arange(n)[None, :, None] < valid_len[:, None, None], x_BxNxD, 0.0).astype(x_BxNxD.dtype)
        q, k, v = self.proj.qkv(x_BxNxD)
        o, st = self.core(x_BxNxD, q, k, v, valid_len)
        return AttentionOutput(y=self.proj.out(o), stats=jax.tree.map(jax.lax.stop_gradient, st))
