"""ABCA's incremental decoder (docs/abca.md, "Decoding"): anchors placed as tokens arrive, a zone-bounded cache.

The causal ABCA layer is a recurrence over positions, so one token at a time reproduces the full forward pass:

* placement at t: explicit (`token == placement.anchor_id`), fixed (`t % placement.interval == 0`) or learned
  (`score(x_t) > 0`); t = 0
  is forced, and the zone cap inserts a fallback where `(t - last placed anchor) % max_zone == 0`;
* interval token t: attends its zone `[left(t), t]`, reading the left anchor's post-handshake key/value (and, with
  P = `summaries_per_anchor` > 1 pooled writes, its P - 1 extra summaries' keys/values in the same softmax);
* anchor t = a_j: stage 1 gathers `[a_{j-1}, t]` (raw keys/values, i.e. the closing zone and itself), once per
  summary (summary p > 0 with its own query `q @ summary_wq[p - 1]`); each handshake step attends the previous
  anchor's step-l key/value of the same summary and its own (chain), or every earlier anchor's (global, ranks below
  `max_anchors`; later ranks keep the chain); its final state gives the key/value the new zone reads.

The cache holds the open zone's raw keys/values (`max_zone` rows), its anchor's post-handshake keys/values, the
previous anchor's handshake keys/values per summary and step and, for the global handshake, those of the first
`max_anchors` anchors: its size does not depend on the context length. Keys of a closed zone are overwritten by the
next zone's.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from sparse_attn.decode.attend import cache_bytes, project
from sparse_attn.decode.registry import DecodeContext
from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.modules.abca.config import ExplicitAnchors, FixedAnchors
from sparse_attn.modules.abca.module import AnchorAttention
from sparse_attn.patterns import abca, common

__all__ = ["AbcaCache", "cache_bytes", "init_cache", "step"]  # cache_bytes: the shared helper, re-exported


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AbcaCache:
    """One layer's decode state; Z = max_zone, P = summaries per anchor, S = handshake steps, M = max_anchors
    (global) or 0 (chain).

    Attributes:
      zone_k, zone_v: [B, Z, G, D] raw (RoPE'd) keys/values of the open zone, row = position - left.
      anchor_k, anchor_v: [B, P, G, D] the open zone's anchor: post-handshake key and (gated) value per summary.
      left: int32[B] the open zone's anchor (-1 before position 0).
      last_placed: int32[B] the last anchor the placement produced (the zone cap counts from it).
      rank: int32[B] anchors so far.
      prev_k, prev_v: [B, P, S, H, D] the previous anchor's handshake key/value per summary and step.
      head_k, head_v: [B, P, S, M, H, D] handshake keys/values of the first M anchors (global handshake).
    """

    zone_k: jax.Array
    zone_v: jax.Array
    anchor_k: jax.Array
    anchor_v: jax.Array
    left: jax.Array
    last_placed: jax.Array
    rank: jax.Array
    prev_k: jax.Array
    prev_v: jax.Array
    head_k: jax.Array
    head_v: jax.Array


def _head_size(module: AnchorAttention) -> int:
    cfg = module.config
    return cfg.max_anchors if cfg.handshake == "global" else 0


def _check_module(module) -> None:
    if not isinstance(module, AnchorAttention):
        raise TypeError(f"the ABCA decoder needs an AnchorAttention, got {type(module).__name__}")
    place = module.config.placement
    if isinstance(place, ExplicitAnchors) and place.anchor_id is None:
        raise ValueError(
            "ABCA decoding with explicit placement reads anchors from token ids: ExplicitAnchors.anchor_id is needed "
            "(an anchor_mask passed to the full forward pass has no decoding counterpart)"
        )


def init_cache(module: AnchorAttention, batch: int, max_len: int, dtype=jnp.float32) -> AbcaCache:
    """An empty cache; its size is independent of `max_len` (only checked), O(max_zone + P max_anchors) per layer."""
    _check_module(module)
    if batch < 1 or max_len < 1:
        raise ValueError(f"batch and max_len must be >= 1, got {batch}, {max_len}")
    cfg, proj = module.config, module.proj
    h, g, d = proj.num_heads, proj.num_kv_heads, proj.head_dim
    p, s, m, z = cfg.summaries_per_anchor, cfg.handshake_steps, _head_size(module), cfg.max_zone

    def zeros(*shape):
        return jnp.zeros(shape, dtype)

    def ints(value):
        return jnp.full((batch,), value, jnp.int32)

    return AbcaCache(
        zone_k=zeros(batch, z, g, d),
        zone_v=zeros(batch, z, g, d),
        anchor_k=zeros(batch, p, g, d),
        anchor_v=zeros(batch, p, g, d),
        left=ints(-1),
        last_placed=ints(0),
        rank=ints(0),
        prev_k=zeros(batch, p, s, h, d),
        prev_v=zeros(batch, p, s, h, d),
        head_k=zeros(batch, p, s, m, h, d),
        head_v=zeros(batch, p, s, m, h, d),
    )


def _attend(q_BxHxD, k_BxKxGxD, v_BxKxGxD, allowed_BxK, scale: float):
    """One query per row against K keys of its KV group, masked; fp32 scores and weights."""
    b, h, d = q_BxHxD.shape
    g = k_BxKxGxD.shape[2]
    q = q_BxHxD.reshape(b, g, h // g, d)
    s = jnp.einsum("bgrd,bkgd->bgrk", q, k_BxKxGxD, preferred_element_type=jnp.float32) * scale
    p, _ = masked_softmax(s, allowed_BxK[:, None, None, :])
    o = jnp.einsum("bgrk,bkgd->bgrd", p, v_BxKxGxD.astype(jnp.float32))
    return o.reshape(b, h, d)


def _placement(module: AnchorAttention, x_Bx1xD, cache: AbcaCache, ctx: DecodeContext):
    """(is_anchor bool[B], placed bool[B], gate float32[B]): the full pass's placement and zone cap, online."""
    cfg, place = module.config, module.config.placement
    b = x_Bx1xD.shape[0]
    t = ctx.pos
    score = None
    if isinstance(place, ExplicitAnchors):
        raw = ctx.token == place.anchor_id
    elif isinstance(place, FixedAnchors):
        raw = jnp.broadcast_to(t % place.interval == 0, (b,))
    else:
        score = module.score(x_Bx1xD)[:, 0, 0].astype(jnp.float32)
        raw = score > 0
    placed = raw | (t == 0)
    # enforce_zone_cap's rule: fallbacks at last_placed + max_zone, + 2 max_zone, ... until the next placed anchor.
    fallback = ~placed & ((t - cache.last_placed) % cfg.max_zone == 0)
    is_anchor = placed | fallback
    gate = jnp.ones((b,), jnp.float32)
    if score is not None and place.straight_through:
        gate = abca.straight_through_gate(score[:, None], is_anchor[:, None])[:, 0]
    return is_anchor, placed, gate


def _handshake(module: AnchorAttention, ap: AnchorProjections, s_BxHxD, pos_Bx1, cache: AbcaCache, summary: int,
               scale: float):  # fmt: skip
    """The new anchor's handshake steps for one summary: (final state [B, H, D], its per-step handshake keys and
    values [B, S, H, D], which the next anchor (chain) or the later head ranks (global) read)."""
    cfg = module.config
    m = _head_size(module)
    rank = cache.rank[:, None]
    in_head = rank < m  # global ranks below max_anchors attend every earlier anchor; the rest keep the chain
    ok_prev = (rank > 0) & ~in_head
    ok_head = in_head & (jnp.arange(m)[None] < rank)
    allowed = jnp.concatenate([ok_prev, ok_head, jnp.ones_like(ok_prev)], axis=1)  # [B, 1 + M + 1]
    prev_k, prev_v = cache.prev_k[:, summary], cache.prev_v[:, summary]
    head_k, head_v = cache.head_k[:, summary], cache.head_v[:, summary]
    ks, vs = [], []
    for step in range(cfg.handshake_steps):
        s = s_BxHxD[:, None]
        q, k, v = ap.query(s, pos_Bx1)[:, 0], ap.key(s, pos_Bx1)[:, 0], ap.value(s, pos_Bx1)[:, 0]
        keys = jnp.concatenate([prev_k[:, step, None], head_k[:, step], k[:, None]], axis=1)
        vals = jnp.concatenate([prev_v[:, step, None], head_v[:, step], v[:, None]], axis=1)
        s_BxHxD = s_BxHxD + _attend(q, keys, vals, allowed, scale).astype(s_BxHxD.dtype)
        ks.append(k)
        vs.append(v)
    return s_BxHxD, jnp.stack(ks, 1), jnp.stack(vs, 1)


def _anchor_projections(module: AnchorAttention) -> AnchorProjections:
    return AnchorProjections(module.anchor_wq[...], module.anchor_wk[...], module.anchor_wv[...],
                             module.config.rope_base)  # fmt: skip


def _summary_queries(module: AnchorAttention, q_BxHxD) -> list[jax.Array]:
    """Each summary's gather query: the anchor's own q (summary 0), then q through `summary_wq[p - 1]`."""
    if module.summary_wq is None:
        return [q_BxHxD]
    w = module.summary_wq[...].astype(q_BxHxD.dtype)
    return [q_BxHxD] + [jnp.einsum("bhd,hde->bhe", q_BxHxD, w_HxDxD) for w_HxDxD in w]


def _check_step(module, x_Bx1xD, cache: AbcaCache, ctx: DecodeContext) -> None:
    _check_module(module)
    proj = module.proj
    model_dim = proj.num_heads * proj.head_dim
    if x_Bx1xD.ndim != 3 or x_Bx1xD.shape[1:] != (1, model_dim):
        raise ValueError(f"ABCA decode step needs x [B, 1, {model_dim}], got shape {x_Bx1xD.shape}")
    b = x_Bx1xD.shape[0]
    if cache.left.shape != (b,):
        raise ValueError(f"cache holds batch {cache.left.shape[0]}, x has batch {b}")
    if jnp.shape(ctx.pos) != ():
        raise ValueError(f"ctx.pos must be a scalar (one position for every row), got shape {jnp.shape(ctx.pos)}")
    if isinstance(module.config.placement, ExplicitAnchors) and jnp.shape(ctx.token) != (b,):
        raise ValueError(f"ctx.token must be int32[{b}], got shape {jnp.shape(ctx.token)}")
    if common.is_concrete(ctx.pos) and int(ctx.pos) < 0:
        raise ValueError(f"ctx.pos must be >= 0, got {int(ctx.pos)}")


def step(module: AnchorAttention, x_Bx1xD: jax.Array, cache: AbcaCache, ctx: DecodeContext):
    """One token at `ctx.pos` (positions 0, 1, ... in order): (y [B, 1, model_dim], cache).

    `y` equals the causal full forward pass's `module(x, AttentionContext(..., causal=True)).y` at that position.
    """
    _check_step(module, x_Bx1xD, cache, ctx)
    cfg, proj = module.config, module.proj
    b = x_Bx1xD.shape[0]
    z = cfg.max_zone
    t = jnp.asarray(ctx.pos, jnp.int32)
    pos_Bx1 = jnp.full((b, 1), t)
    scale = 1.0 / math.sqrt(proj.head_dim)
    bi = jnp.arange(b)
    q, k, v = project(proj, x_Bx1xD, t)
    is_anchor, placed, gate = _placement(module, x_Bx1xD, cache, ctx)
    row = jnp.arange(z)[None]
    off = t - cache.left  # interval token: its row in the zone; anchor: rows of the closing zone (<= max_zone)

    # Stages 1-2 (anchor rows), per summary: gather the closing zone [a_{j-1}, t) from the cache (none at t = 0)
    # and t itself, then shake hands with the same summary of the earlier anchors.
    keys = jnp.concatenate([cache.zone_k, k[:, None]], axis=1)
    vals = jnp.concatenate([cache.zone_v, v[:, None]], axis=1)
    closing = (row < off[:, None]) & (cache.rank[:, None] > 0)
    allowed = jnp.concatenate([closing, jnp.ones((b, 1), bool)], axis=1)
    ap = _anchor_projections(module)
    g = gate[:, None, None].astype(q.dtype)
    hs_k, hs_v, k_a, v_a = [], [], [], []
    for p, q_p in enumerate(_summary_queries(module, q)):
        s_p = _attend(q_p, keys, vals, allowed, scale).astype(q.dtype)
        s_p, ks_p, vs_p = _handshake(module, ap, s_p, pos_Bx1, cache, p, scale)
        if p == 0:
            s = s_p  # summary 0 is the anchor's own state: the anchor's output
        hs_k.append(ks_p)
        hs_v.append(vs_p)
        k_a.append(ap.key(s_p[:, None], pos_Bx1, proj.num_kv_heads)[:, 0])
        v_a.append(ap.value(s_p[:, None], pos_Bx1, proj.num_kv_heads)[:, 0] * g)
    k_a, v_a, hs_k, hs_v = (jnp.stack(x, 1) for x in (k_a, v_a, hs_k, hs_v))  # [B, P, ...]

    # Stage 3 (interval rows): [left, t], the anchor's row read as its post-handshake key/value, and its extra
    # summaries as P - 1 more keys of the same softmax (the full pass merges them through the zone stage's lse).
    write = jnp.where(is_anchor, 0, jnp.clip(off, 0, z - 1))  # an anchor opens a zone at row 0
    zone_k = cache.zone_k.at[bi, write].set(k.astype(cache.zone_k.dtype))
    zone_v = cache.zone_v.at[bi, write].set(v.astype(cache.zone_v.dtype))
    first = (row == 0)[..., None, None]
    k3 = jnp.where(first, cache.anchor_k[:, :1], zone_k)
    v3 = jnp.where(first, cache.anchor_v[:, :1], zone_v)
    k3 = jnp.concatenate([k3, cache.anchor_k[:, 1:]], axis=1)
    v3 = jnp.concatenate([v3, cache.anchor_v[:, 1:]], axis=1)
    extra = jnp.ones((b, cfg.summaries_per_anchor - 1), bool)
    o3 = _attend(q, k3, v3, jnp.concatenate([row <= off[:, None], extra], axis=1), scale).astype(q.dtype)

    o = jnp.where(is_anchor[:, None, None], s * g, o3)
    y = proj.out(o[:, None]).astype(x_Bx1xD.dtype)

    a = is_anchor

    def sel(new, old):
        return jnp.where(a.reshape((b,) + (1,) * (old.ndim - 1)), new.astype(old.dtype), old)

    m = _head_size(module)
    head_row = jnp.where(a & (cache.rank < m), cache.rank, m)  # index m: dropped (no write)
    head_k = cache.head_k.at[bi, :, :, head_row].set(hs_k.astype(cache.head_k.dtype), mode="drop")
    head_v = cache.head_v.at[bi, :, :, head_row].set(hs_v.astype(cache.head_v.dtype), mode="drop")
    new = AbcaCache(
        zone_k=zone_k,
        zone_v=zone_v,
        anchor_k=sel(k_a, cache.anchor_k),
        anchor_v=sel(v_a, cache.anchor_v),
        left=jnp.where(a, t, cache.left),
        last_placed=jnp.where(placed, t, cache.last_placed),
        rank=cache.rank + a.astype(jnp.int32),
        prev_k=sel(hs_k, cache.prev_k),
        prev_v=sel(hs_v, cache.prev_v),
        head_k=head_k,
        head_v=head_v,
    )
    return y, new
