"""ABCA's information path: does the key a query needs reach it through
zone -> anchor -> handshake -> anchor -> zone, and how much weight does each hop give it?

    maps = abca_maps(module, x_BxNxD, ctx)            # one layer's three stages as dense weights
    hops = abca_hops(maps, q_pos_BxP, k_pos_BxP)      # float32[B, H, P] per hop
    w_BxHxNxN = layer_flow(maps)                      # the layer's token -> token flow

`abca_maps` replays an `AnchorAttention` layer densely (the oracle's masks, one softmax per stage) and rebuilds its
output from the weights, so the weights are the ones the layer used (tested: `maps.out` equals the layer's core).
The flow follows attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020): a
residual update s <- s + attn(s) counts as 0.5 I + 0.5 A, so that every row of the flow sums to 1, and the
projections are left out (the flow says where information may come from, not how it is transformed).

The hops of a pair (query t, key e) of one layer:
  direct     zone weight of t on e itself (e in t's zone, not an anchor)
  to_anchor  zone weight of t on its anchors (what the query reads from the anchor route at all)
  gather     the largest gather weight an anchor puts on e (the anchor that can carry e)
  handshake  the largest handshake flow from an anchor that gathers e to an anchor that t reads (0: no route)
  handshake_peak  the largest weight in the first handshake row of an anchor t reads, whatever key it goes to: how
             sharp the handshake is, beside `handshake`, which says whether it is sharp towards the needed anchor
  flow       the layer's flow from e to t: direct + the anchor route, every hop's weight multiplied
With pooled writes (`summaries_per_anchor` P > 1) each anchor's P summaries are P routes: `to_anchor` and `flow` sum
over them, `gather`, `handshake` and `handshake_peak` take the largest (`AbcaMaps.summaries` holds the extra ones).
Each comes with its `*_uniform`: the same hop under uniform attention (every logit 0), the weight of a layer that
has learned nothing. A hop at its uniform value, or 0 where the uniform one is not, is where the path fails.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sparse_attn.diagnostics.retrieval import check_positions
from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.modules.abca import AnchorAttention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.patterns.abca.zones import Zones

HIGHEST = jax.lax.Precision.HIGHEST


class SummaryMaps(NamedTuple):
    """One extra anchor summary's weights (pooled writes), float32[B, H, N, N]."""

    gather: jax.Array  # stage 1 with the summary's own gather query
    handshake: tuple[jax.Array, ...]  # stage 2, one per step, between this summary of the anchors
    read: jax.Array  # stage 3: each row's weight on this summary of the anchors it holds (anchor columns)


class AbcaMaps(NamedTuple):
    """One ABCA layer's weights, float32[B, H, N, N] (row: query, column: key; rows without keys are 0)."""

    zones: Zones
    gather: jax.Array  # stage 1: anchor rows over the zones they bound
    handshake: tuple[jax.Array, ...]  # stage 2, one per step: anchor rows over their handshake anchors
    zone: jax.Array  # stage 3: every row over [left(t), t] (causal) or [left(t), right(t)]; anchors: summary 0
    out: jax.Array  # [B, N, H, D]: the core's output rebuilt from these weights
    summaries: tuple[SummaryMaps, ...] = ()  # summaries 1 .. P - 1 (pooled writes); () for one summary per anchor


def _heads(x_BxNxGxD, h: int):
    """KV heads to query heads: head h reads group h // (H / G)."""
    return jnp.repeat(x_BxNxGxD, h // x_BxNxGxD.shape[2], axis=2)


def softmax_weights(q_BxNxHxD, k_BxNxGxD, mask_BxHxNxN, scale: float, *, uniform: bool = False) -> jax.Array:
    """float32[B, H, N, N]: softmax(q k^T * scale) over the mask's keys (`uniform`: every logit 0); 0 on rows
    without a key."""
    k = _heads(k_BxNxGxD, q_BxNxHxD.shape[2]).astype(jnp.float32)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q_BxNxHxD.astype(jnp.float32), k, precision=HIGHEST) * scale
    logits = jnp.zeros_like(logits) if uniform else logits
    logits = jnp.where(mask_BxHxNxN, logits, -jnp.inf)
    top = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.where(mask_BxHxNxN, jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    return e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), jnp.finfo(jnp.float32).tiny)


def _apply(w_BxHxNxN, v_BxNxHxD):
    return jnp.einsum("bhqk,bkhd->bqhd", w_BxHxNxN, v_BxNxHxD.astype(jnp.float32), precision=HIGHEST)


def abca_maps(module: AnchorAttention, x_BxNxD, ctx: AttentionContext, *, uniform: bool = False,
              anchor_mask=None) -> AbcaMaps:  # fmt: skip
    """The weights of `module` on its normed input (as `AnchorAttention.__call__` computes them, densely)."""
    cfg = module.config
    b, n, _ = x_BxNxD.shape
    live = (jnp.arange(n)[None] < ctx.valid_len[:, None])[..., None]
    x = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
    is_anchor, _, gate, _ = module._placement(x, ctx, anchor_mask)
    zones = abca.compute_zones(is_anchor, ctx.valid_len)
    q, k, v = module.proj.qkv(x)
    h, groups = q.shape[2], k.shape[2]
    proj = AnchorProjections(module.anchor_wq[...], module.anchor_wk[...], module.anchor_wv[...],
                             rope_base=cfg.rope_base)  # fmt: skip
    scale = 1.0 / math.sqrt(q.shape[-1])
    stage = lambda name: ZonePattern(zones, stage=name, causal=ctx.causal, max_zone=cfg.max_zone).to_dense()  # noqa: E731
    pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (b, n))
    if cfg.handshake == "chain":
        hs = abca.chain_handshake(zones, causal=ctx.causal)
    else:
        hs, _ = abca.global_handshake(zones, max_anchors=cfg.max_anchors, causal=ctx.causal)
    hs_mask = hs.to_dense()
    g = (jnp.ones((b, n), jnp.float32) if gate is None else gate)[..., None, None]

    def summary(q_gather):  # stages 1-2 of one summary: (gather weights, handshake weights, k, v, state)
        w_gather = softmax_weights(q_gather, k, stage("gather"), scale, uniform=uniform)
        s, w_hs = _apply(w_gather, _heads(v, h)), []
        for _ in range(cfg.handshake_steps):
            w = softmax_weights(proj.query(s, pos), proj.key(s, pos), hs_mask, scale, uniform=uniform)
            s = s + _apply(w, proj.value(s, pos))
            w_hs.append(w)
        return w_gather, tuple(w_hs), proj.key(s, pos, groups), proj.value(s, pos, groups) * g, s

    extra_wq = [] if module.summary_wq is None else list(module.summary_wq[...])
    runs = [summary(q)] + [summary(jnp.einsum("bnhd,hde->bnhe", q, w, precision=HIGHEST)) for w in extra_wq]
    w_gather, w_hs, k_a, v_a, s = runs[0]
    anchor = zones.is_anchor[..., None, None]
    k3 = jnp.where(anchor, k_a, k.astype(jnp.float32))
    v3 = jnp.where(anchor, v_a, v.astype(jnp.float32))
    # Stage 3 as one softmax over the zone's keys and the extra summaries of the anchors each row holds (the core
    # merges the same terms through the stage's log-sum-exp).
    zone_mask = stage("zones")
    held = zone_mask & zones.is_anchor[:, None, None, :]
    keys = jnp.concatenate([k3] + [r[2] for r in runs[1:]], axis=1)
    mask = jnp.concatenate([zone_mask] + [held] * len(extra_wq), axis=-1)
    w_all = jnp.split(softmax_weights(q, keys, mask, scale, uniform=uniform), len(runs), axis=-1)
    o = _apply(w_all[0], _heads(v3, h))
    for w, r in zip(w_all[1:], runs[1:], strict=True):
        o = o + _apply(w, _heads(r[3], h))
    out = jnp.where(anchor, s * g, o)
    summaries = tuple(SummaryMaps(r[0], r[1], w) for r, w in zip(runs[1:], w_all[1:], strict=True))
    return AbcaMaps(zones, w_gather, w_hs, w_all[0], out, summaries)


def _routes(maps: AbcaMaps) -> list[tuple[jax.Array, tuple[jax.Array, ...], jax.Array]]:
    """(gather, handshake, read) of every summary: summary 0 reads at the zone map's anchor columns."""
    col_anchor = maps.zones.is_anchor[:, None, None, :]
    first = (maps.gather, maps.handshake, jnp.where(col_anchor, maps.zone, 0.0))
    return [first] + [(sm.gather, sm.handshake, sm.read) for sm in maps.summaries]


def handshake_flow(maps: AbcaMaps, summary: int = 0) -> jax.Array:
    """float32[B, H, N, N]: anchor -> anchor flow of one summary's handshake steps (0.5 I + 0.5 A per residual
    step; rows of non-anchors are the identity)."""
    n = maps.zone.shape[-1]
    eye = jnp.eye(n, dtype=jnp.float32)[None, None]
    anchor = maps.zones.is_anchor[:, None, :, None]
    m = jnp.broadcast_to(eye, maps.zone.shape)
    for w in _routes(maps)[summary][1]:
        m = jnp.einsum("bhij,bhjk->bhik", jnp.where(anchor, 0.5 * eye + 0.5 * w, eye), m, precision=HIGHEST)
    return m


def _carried(maps: AbcaMaps, summary: int) -> jax.Array:
    """float32[B, H, N, N]: what one summary of each anchor carries of each key (handshake flow x gather)."""
    return jnp.einsum("bhij,bhjk->bhik", handshake_flow(maps, summary), _routes(maps)[summary][0], precision=HIGHEST)


def layer_flow(maps: AbcaMaps) -> jax.Array:
    """float32[B, H, N, N]: how much of key e's value reaches query t in this layer, over every ABCA route (rows of
    live tokens sum to 1)."""
    col_anchor = maps.zones.is_anchor[:, None, None, :]
    carried = [_carried(maps, p) for p in range(1 + len(maps.summaries))]
    flow = jnp.where(col_anchor, 0.0, maps.zone)
    for (_, _, read), carried_p in zip(_routes(maps), carried, strict=True):
        flow = flow + jnp.einsum("bhij,bhjk->bhik", read, carried_p, precision=HIGHEST)
    return jnp.where(maps.zones.is_anchor[:, None, :, None], carried[0], flow)  # anchors output summary 0


def _pairs(x_BxHxNxN, q_pos_BxP, k_pos_BxP):
    return jax.vmap(lambda x, qi, ki: x[:, qi, ki])(x_BxHxNxN, q_pos_BxP, k_pos_BxP)  # [B, H, P]


def _hops(maps: AbcaMaps, q_pos, k_pos) -> dict:
    anchor_col = maps.zones.is_anchor[:, None, None, :]
    take_rows = jax.vmap(lambda x, i: x[:, i])  # [B, H, N, ...] at rows [P] -> [B, H, P, ...]
    take_cols = jax.vmap(lambda x, i: jnp.moveaxis(x[..., i], -1, 1))  # [B, H, N, N] at columns [P] -> [B, H, P, N]
    to_anchor = gather = handshake = peak_read = 0.0
    for p, (w_gather, w_hs, reads) in enumerate(_routes(maps)):  # reads: [B, H, N, N], t -> anchors it reads
        gathers = take_cols(w_gather, k_pos)  # [B, H, P, N_anchor]: each anchor's weight on e
        read_by_t = take_rows(reads, q_pos) > 0  # [B, H, P, N_anchor]
        route = jnp.einsum("bhpa,bhag,bhpg->bhpag", read_by_t.astype(jnp.float32), handshake_flow(maps, p),
                           (gathers > 0).astype(jnp.float32), precision=HIGHEST)  # fmt: skip
        peak = jnp.max(w_hs[0], axis=-1)[:, :, None, :]  # [B, H, 1, N_anchor]: each anchor row's largest
        to_anchor = to_anchor + jnp.sum(take_rows(reads, q_pos), axis=-1)
        gather = jnp.maximum(gather, jnp.max(gathers, axis=-1))
        handshake = jnp.maximum(handshake, jnp.max(route, axis=(-1, -2)))
        peak_read = jnp.maximum(peak_read, jnp.max(jnp.where(read_by_t, peak, 0.0), axis=-1))
    return {
        "direct": _pairs(jnp.where(anchor_col, 0.0, maps.zone), q_pos, k_pos),
        "to_anchor": to_anchor,
        "gather": gather,
        "handshake": handshake,
        "handshake_peak": peak_read,
        "flow": _pairs(layer_flow(maps), q_pos, k_pos),
    }


def abca_hops(maps: AbcaMaps, q_pos_BxP, k_pos_BxP, uniform_maps: AbcaMaps | None = None) -> dict:
    """{hop: float32[B, H, P]} for the pairs (q_pos[b, p], k_pos[b, p]) (module docstring), plus `*_uniform` from
    `uniform_maps` (`abca_maps(..., uniform=True)`) when given."""
    n, b = maps.zone.shape[-1], maps.zone.shape[0]
    q_pos, k_pos = (check_positions(name, p, n) for name, p in (("q_pos", q_pos_BxP), ("k_pos", k_pos_BxP)))
    q_pos, k_pos = jnp.broadcast_to(q_pos, (b, q_pos.shape[1])), jnp.broadcast_to(k_pos, (b, k_pos.shape[1]))
    out = _hops(maps, q_pos, k_pos)
    if uniform_maps is not None:
        out.update({f"{k}_uniform": v for k, v in _hops(uniform_maps, q_pos, k_pos).items()})
    return out
