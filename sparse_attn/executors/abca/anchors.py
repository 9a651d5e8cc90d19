"""Anchor operations of ABCA's "packed" executor: the key-major anchor gather (stage 1, position space, O(N)) and
the paged handshake (stage 2, rank space, O(k)); neither has a capacity that could drop an anchor.

Anchor states live in head space, `[B, N, H, D]` (zero away from anchors). The anchor projections `w_q, w_k, w_v`
(`[H, D, D]`, per head) re-project them into handshake queries/keys/values and, after the handshake, into the keys
and values that zone attention reads at the anchor positions. RoPE (when used) rotates anchor queries/keys by the
anchor's own position, like every other token's.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import finite, nonfinite_rows
from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.rope import apply_rope
from sparse_attn.patterns.abca.handshake import anchor_positions
from sparse_attn.patterns.abca.zones import Zones


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AnchorProjections:
    """w_q, w_k, w_v: [H, D, D]; rope_base static (None: no RoPE).

    `key`/`value` with `groups=G < H` (grouped-query attention) give one key/value per KV group: the sum of the
    group's per-head projections, i.e. a projection of the group's R = H / G concatenated head states.
    """

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    rope_base: float | None = dataclasses.field(default=None, metadata={"static": True})

    def _proj(self, s, w, pos_BxM, rope: bool, groups: int | None = None):
        b, m, h, _ = s.shape
        g = h if groups is None else groups
        ws = w.astype(s.dtype)
        if g == h:
            out = jnp.einsum("bmhd,hde->bmhe", s, ws)
        else:
            out = jnp.einsum("bmgrd,grde->bmge", s.reshape(b, m, g, h // g, -1), ws.reshape(g, h // g, *ws.shape[1:]))
        return apply_rope(out, pos_BxM, self.rope_base) if rope and self.rope_base is not None else out

    def query(self, s_BxMxHxD, pos_BxM):
        return self._proj(s_BxMxHxD, self.w_q, pos_BxM, True)

    def key(self, s_BxMxHxD, pos_BxM, groups: int | None = None):
        return self._proj(s_BxMxHxD, self.w_k, pos_BxM, True, groups)

    def value(self, s_BxMxHxD, pos_BxM, groups: int | None = None):
        return self._proj(s_BxMxHxD, self.w_v, pos_BxM, False, groups)


def _take(x_BxNx, idx_BxN):
    """x[b, idx[b, t]] with idx clipped (callers mask the invalid ones)."""
    bi = jnp.arange(x_BxNx.shape[0])[:, None]
    return x_BxNx[bi, jnp.clip(idx_BxN, 0, x_BxNx.shape[1] - 1)]


def gather_roles(zones: Zones, causal: bool) -> list[jax.Array]:
    """For each key position p, the anchors whose stage-1 range holds p (-1: none); at most 3, all distinct.

    Bidirectional: a_z = left(p) (range [a_{z-1}, a_{z+1}]), the next anchor after p, and, when p is an anchor,
    its previous anchor. Causal (ranges [a_{j-1}, a_j]): the next anchor after p, and p itself when an anchor.
    """
    n = zones.num_tokens
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    live = pos < zones.valid_len[:, None]
    nxt = jnp.where(live & (zones.right > pos) & _take(zones.is_anchor, zones.right), zones.right, -1)
    own = jnp.where(zones.is_anchor, pos, -1)
    if causal:
        return [nxt, own]
    return [jnp.where(live, zones.left, -1), nxt, zones.prev_anchor]


def anchor_gather(q_BxNxHxD, k_BxNxHxD, v_BxNxHxD, zones: Zones, scale: float, *, causal: bool, roles=None):
    """Stage 1 key-major: every key scores against the <= 3 anchors that read it; softmax per anchor by segment sums.

    Returns (anchor states [B, N, H, D] (0 at non-anchors), lse float32 [B, N, H] (-inf at non-anchors)). Exact
    stage-1 ranges (docs/abca.md) with O(N) pairs, whatever k is.
    The backward pass is written out (flash-style, probabilities recomputed from the per-anchor lse), so autodiff
    keeps no per-role [B, N, H, D] residuals. Non-finite values run as 0 inside it and make the anchors that read
    them NaN: every scored pair is allowed, but the backward pass's `0 * NaN` at unused roles would spread them.
    Every pair touching a non-finite entry lies in such an anchor, whose cotangent the select drops, so the entry's
    gradient is exactly 0. `roles`: `gather_roles(zones, causal)` when already built (a prepared pattern).
    """
    roles = list(gather_roles(zones, causal) if roles is None else roles)
    out, lse = _anchor_gather(q_BxNxHxD, k_BxNxHxD, v_BxNxHxD, jnp.stack(roles), float(scale))
    lse = jnp.where(lse == jnp.inf, -jnp.inf, lse)
    q_bad, k_bad = nonfinite_rows(q_BxNxHxD), nonfinite_rows(k_BxNxHxD) | nonfinite_rows(v_BxNxHxD)
    b, n, h = q_bad.shape
    bi = jnp.arange(b)[:, None]
    kv_bad = jnp.repeat(k_bad, h // k_bad.shape[2], axis=2)  # [B, N, H]: key p's k or v, for each head
    bad = jnp.zeros((b, n, h), bool)
    for r in roles:  # anchor r(p) reads q at r(p) and k, v at p
        bad = bad.at[bi, jnp.where(r >= 0, r, n)].max(kv_bad | _take(q_bad, r), mode="drop")
    return jnp.where(bad[..., None], jnp.nan, out), jnp.where(bad, jnp.nan, lse)


def _grouped(x_BxNxHx, groups: int):
    """[B, N, H, ...] -> [B, N, G, R, ...] (query head h = g * R + r)."""
    b, n, h = x_BxNxHx.shape[:3]
    return x_BxNxHx.reshape(b, n, groups, h // groups, *x_BxNxHx.shape[3:])


def _heads(x_BxNxGxRx):
    return x_BxNxGxRx.reshape(*x_BxNxGxRx.shape[:2], -1, *x_BxNxGxRx.shape[4:])


def _role_scores(q, k, roles, scale):
    """[B, N, H] per role: q of the reading anchor against the key of its KV group."""
    g = k.shape[2]

    def score(r):
        return jnp.einsum("bngrd,bngd->bngr", _grouped(_take(q, r), g), k, preferred_element_type=jnp.float32)

    return [_heads(score(r)) * scale for r in roles]


def _spread(w_BxNxH, x_BxNxGxD):
    """w[b, n, h] * x[b, n, group(h)] as [B, N, H, D] (an einsum: see `_scale_rows`)."""
    return _heads(jnp.einsum("bngr,bngd->bngrd", _grouped(w_BxNxH, x_BxNxGxD.shape[2]), x_BxNxGxD))


def _collect(w_BxNxH, x_BxNxHxD, groups: int):
    """sum over the heads of each group of w * x: [B, N, G, D]."""
    return jnp.einsum("bngr,bngrd->bngd", _grouped(w_BxNxH, groups), _grouped(x_BxNxHxD, groups))


def _gather_forward(q, k, v, roles_RxBxN, scale):
    q, k, v = finite(q), finite(k), finite(v)  # transient: the custom VJP keeps the inputs
    roles = list(roles_RxBxN)
    b, n, h, d = q.shape
    bi = jnp.arange(b)[:, None]

    def drop(r):  # scatter index n is dropped
        return jnp.where(r >= 0, r, n)

    scores = _role_scores(q, k, roles, scale)
    m = jnp.full((b, n, h), -jnp.inf, jnp.float32)
    for r, s in zip(roles, scores, strict=True):
        m = m.at[bi, drop(r)].max(s, mode="drop")
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    total = jnp.zeros((b, n, h), jnp.float32)
    acc = jnp.zeros((b, n, h, d), jnp.float32)
    for r, s in zip(roles, scores, strict=True):
        ok = (r >= 0)[..., None]
        e = jnp.where(ok, jnp.exp(jnp.where(ok, s - _take(m, r), 0.0)), 0.0)
        total = total.at[bi, drop(r)].add(e, mode="drop")
        acc = acc.at[bi, drop(r)].add(_spread(e, v.astype(jnp.float32)), mode="drop")
    alive = total > 0
    out = _scale_rows(jnp.where(alive, 1.0 / jnp.where(alive, total, 1.0), 0.0), acc)
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, total, 1.0)), jnp.inf)  # +inf: exp(s - lse) = 0
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _anchor_gather(q, k, v, roles, scale):
    """(out, lse) with lse = +inf on rows without a key (so that exp(s - lse) = 0 there)."""
    return _gather_forward(q, k, v, roles, scale)


def _anchor_gather_fwd(q, k, v, roles, scale):
    out, lse = _gather_forward(q, k, v, roles, scale)
    return (out, lse), (q, k, v, roles, out, lse)


def _anchor_gather_bwd(scale, res, cts):
    q, k, v, roles, out, lse = res
    dout, dlse = cts  # d lse / d s = p: dlse enters like -delta
    b, n, h = q.shape[:3]
    bi = jnp.arange(b)[:, None]
    g = k.shape[2]
    # A pair touching a non-finite entry belongs to an anchor that `anchor_gather` set to NaN, so its cotangent is 0:
    # select such pairs away instead of forming 0 * NaN (selects on existing temporaries, no sanitised copies).
    q_bad = nonfinite_rows(q)
    kv_bad = jnp.repeat(nonfinite_rows(k) | nonfinite_rows(v), h // g, axis=2)  # [B, N, H]
    dout = dout.astype(jnp.float32)
    delta = jnp.einsum("bnhd,bnhd->bnh", dout, out.astype(jnp.float32))
    delta = delta - jnp.where(jnp.isfinite(lse), dlse, 0.0)
    dq = jnp.zeros(q.shape, jnp.float32)
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for r, s in zip(list(roles), _role_scores(q, k, list(roles), scale), strict=True):
        ok = (r >= 0)[..., None] & ~kv_bad & ~_take(q_bad, r)
        p = jnp.where(ok, jnp.exp(jnp.minimum(s - _take(lse, r), 0.0)), 0.0)  # [B, N, H]: weight of key p for r(p)
        do_r = _take(dout, r)
        dp = _heads(jnp.einsum("bngrd,bngd->bngr", _grouped(do_r, g), v.astype(jnp.float32)))
        ds = jnp.where(ok, p * (dp - _take(delta, r)) * scale, 0.0)
        dv = dv + _collect(p, do_r, g)
        dk = dk + _collect(ds, finite(_take(q, r)).astype(jnp.float32), g)
        dq_r = jnp.where(kv_bad[..., None], 0.0, _spread(ds, k.astype(jnp.float32)))
        dq = dq.at[bi, jnp.where(r >= 0, r, n)].add(dq_r, mode="drop")
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_anchor_gather.defvjp(_anchor_gather_fwd, _anchor_gather_bwd)


def _scale_rows(w_BxNxH, x_BxNxHxD):
    # An einsum, not `w[..., None] * x`: the transpose w.r.t. w is then a dot, which XLA:CPU runs ~15x faster than
    # the broadcast's reduce over D (measured 0.2 ms vs 3.7 ms at [1, 4096, 4, 64]).
    return jnp.einsum("bnh,bnhd->bnhd", w_BxNxH, x_BxNxHxD)


# -- handshake on anchors in rank space (rank i = the i-th anchor), in pages ---------------------------------------


@jax.custom_vjp
def rank_to_position(x_BxRx, rank_BxN, anchor_BxN, anc_BxR):
    """x[b, rank[b, t]] at the anchors t, 0 elsewhere: rank space [B, R, ...] back to position space [B, N, ...].

    `rank`: each position's zone id clipped to [0, R); `anc`: each rank's anchor position (`anchor_positions`, N
    for ranks without one). The backward pass gathers the cotangent at each rank's anchor (one position per rank)
    where autodiff would scatter-add all N positions into the k ranks: on a GPU that is N x H x D colliding atomic
    adds (max_zone-way), and with zones known at compile time it was the constant XLA folded (docs/abca.md,
    "Compile time").
    """
    bi = jnp.arange(x_BxRx.shape[0])[:, None]
    return _where_rows(anchor_BxN, x_BxRx[bi, rank_BxN])


def _where_rows(keep_BxN, x_BxNx):
    return jnp.where(keep_BxN.reshape(keep_BxN.shape + (1,) * (x_BxNx.ndim - 2)), x_BxNx, 0)


def _rank_to_position_fwd(x_BxRx, rank_BxN, anchor_BxN, anc_BxR):
    return rank_to_position(x_BxRx, rank_BxN, anchor_BxN, anc_BxR), (rank_BxN, anchor_BxN, anc_BxR)


def _rank_to_position_bwd(res, ct_BxNx):
    rank, anchor, anc = res
    n = ct_BxNx.shape[1]
    bi = jnp.arange(ct_BxNx.shape[0])[:, None]
    # Rank r's cotangent is its anchor's (zone_id(anc[r]) == r); ranks without an anchor (anc == N) get 0.
    padded = jnp.pad(_where_rows(anchor, ct_BxNx), [(0, 0), (0, 1)] + [(0, 0)] * (ct_BxNx.ndim - 2))
    return padded[bi, jnp.minimum(anc, n)], None, None, None


rank_to_position.defvjp(_rank_to_position_fwd, _rank_to_position_bwd)


def _shift(x_BxMx, by: int):
    """Row i of the result is row i + by of x (zero / False where out of range)."""
    m = x_BxMx.shape[1]
    pad = [(0, 0)] * x_BxMx.ndim
    pad[1] = (max(-by, 0), max(by, 0))
    return jax.lax.slice_in_dim(jnp.pad(x_BxMx, pad), max(by, 0), max(by, 0) + m, axis=1)


def _chain_attend(s, q, k, v, live_BxM, scale: float, causal: bool):
    """Each live rank attends ranks (i - 1, i, i + 1) [causal: (i - 1, i)] by shifted rows: O(M), no M x M."""
    offsets = (-1, 0) if causal else (-1, 0, 1)

    def score(o):
        return jnp.einsum("bmhd,bmhd->bmh", q, _shift(k, o), preferred_element_type=jnp.float32)

    sc = jnp.stack([score(o) for o in offsets], -1) * scale  # [B, M, H, S]
    ok = jnp.stack([live_BxM & _shift(live_BxM, o) for o in offsets], -1)  # [B, M, S]
    p, _ = masked_softmax(sc, ok[:, :, None, :])
    upd = sum(jnp.einsum("bmh,bmhd->bmhd", p[..., j], _shift(v, o).astype(jnp.float32)) for j, o in enumerate(offsets))
    return s + upd.astype(s.dtype)


def _global_attend(s, q, k, v, live_BxM, scale: float, causal: bool):
    """Every live rank attends every live rank [causal: ranks <= its own]: dense M x M."""
    m = s.shape[1]
    ok = live_BxM[:, :, None] & live_BxM[:, None, :]
    if causal:
        ok = ok & jnp.tril(jnp.ones((m, m), bool))[None]
    sc = jnp.einsum("bihd,bjhd->bhij", q, k, preferred_element_type=jnp.float32) * scale
    p, _ = masked_softmax(sc, ok[:, None])
    return s + jnp.einsum("bhij,bjhd->bihd", p, v.astype(jnp.float32)).astype(s.dtype)


def _pages(fn, xs, num_pages: int, active):
    """Stacks fn(page) over the leading page axis of xs; pages >= active return zeros without running fn.

    Inputs come in as scan `xs` (not closed over), so the backward pass writes each page's cotangent into its own
    slice instead of adding a full-length array per page; each page is rematerialised, so residuals are the xs.
    """
    if num_pages == 1:  # no loop, no skip: inactive ranks compute zeros anyway (compile time, docs/abca.md)
        return jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], xs)))
    shapes = jax.eval_shape(fn, jax.tree.map(lambda x: x[0], xs))

    def skip(_):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(a):
        return jax.lax.cond(a[0] < active, fn, skip, a[1])

    return jax.lax.map(jax.checkpoint(body), (jnp.arange(num_pages), xs))


def paged_handshake(
    s_BxNxHxD,
    zones: Zones,
    proj: AnchorProjections,
    scale: float,
    *,
    causal: bool,
    handshake: str,
    steps: int,
    page: int,
    max_anchors: int | None = None,
    num_pages: int | None = None,
    groups: int | None = None,
):
    """Stage 2 and the re-projection of the anchors' final states, for any number of anchors.

    Anchors are compacted to rank space and cut into pages of `page` ranks (one page in the common case), each with
    a one-rank halo for the chain; pages past the last anchor are skipped, so the work is O(k), not O(N).
    chain: ranks (i - 1, i, i + 1) [causal: (i - 1, i)]. global: the first `max_anchors` ranks attend each other
    densely and the ranks past them keep the chain, as `patterns.abca.global_handshake` defines.

    Returns:
      (s [B, R, H, D], k_a, v_a [B, R, G, D]) in rank space, R = num_pages * page (rank i: the i-th anchor); G =
      `groups` KV heads for zone attention (default H).
    """
    b, n = s_BxNxHxD.shape[:2]
    bi = jnp.arange(b)[:, None]
    num_pages = -(-n // page) if num_pages is None else num_pages
    r = num_pages * page
    anc = jnp.minimum(anchor_positions(zones, r), n - 1)  # [B, R]
    live = jnp.arange(r)[None] < zones.num_anchors[:, None]
    active = -(-jnp.max(zones.num_anchors) // page)
    halo = jnp.arange(num_pages)[:, None] * page + jnp.arange(page + 2)[None]  # padded rank of each window row

    def windows(x_BxRx, fill=0):  # [B, R, ...] -> [P, B, page + 2, ...]; ranks -1 and R read `fill`
        pad = [(0, 0), (1, 1)] + [(0, 0)] * (x_BxRx.ndim - 2)
        return jnp.moveaxis(jnp.pad(x_BxRx, pad, constant_values=fill)[:, halo], 1, 0)

    def rank_space(x_PxBxLx):
        return jnp.moveaxis(x_PxBxLx, 0, 1).reshape((b, r) + x_PxBxLx.shape[3:])

    def chain_page(x, last: bool):
        sw, aw, lw = x
        q, k, v = proj.query(sw, aw), proj.key(sw, aw), proj.value(sw, aw)
        out = _chain_attend(sw, q, k, v, lw, scale, causal)[:, 1:-1]
        if not last:
            return out
        a = aw[:, 1:-1]  # the final states' keys and values, re-projected on the same page
        return out, proj.key(out, a, groups), proj.value(out, a, groups)

    head = 0 if handshake == "chain" else min(r, max_anchors)
    anc_w, live_w = windows(anc), windows(live)
    # Step 1 reads its windows straight from position space; rows that are not anchors read position N, a zero row.
    pos_w = windows(jnp.where(live, anc, n), fill=n)
    s_w = jnp.pad(s_BxNxHxD, ((0, 0), (0, 1), (0, 0), (0, 0)))[jnp.arange(b)[None, :, None], pos_w]
    s_c = None
    for step in range(steps):
        last = step == steps - 1
        fn = functools.partial(chain_page, last=last)
        out = _pages(fn, (s_w if s_c is None else windows(s_c), anc_w, live_w), num_pages, active)
        new = rank_space(out[0] if last else out)
        if head:
            def top(x):
                return x[:, :head]

            hs, ha = top(s_c) if s_c is not None else s_BxNxHxD[bi, top(anc)], top(anc)
            dense = _global_attend(
                hs, proj.query(hs, ha), proj.key(hs, ha), proj.value(hs, ha), top(live), scale, causal
            )
            new = jnp.concatenate([dense, new[:, head:]], axis=1)
        s_c = new
    k_c, v_c = rank_space(out[1]), rank_space(out[2])
    if head:  # the head's final states came from the dense step: re-project them
        hs, ha = s_c[:, :head], anc[:, :head]
        k_c = jnp.concatenate([proj.key(hs, ha, groups), k_c[:, head:]], axis=1)
        v_c = jnp.concatenate([proj.value(hs, ha, groups), v_c[:, head:]], axis=1)
    return s_c, k_c, v_c
