"""The non-crossing attention core (docs/noncrossing.md): pure functions from projected q, k, v and the router's
inputs to the attention output and its aux (the routed diagrams and the key rows).

Per head a router builds a TL diagram; each query attends its key row ``[self, top partner, (bottom partner)]``
(K <= 3) with the creator gate ``log σ(score)`` added to each routed arc's logit, so the router learns through the
attention loss.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.attention import attention
from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.modules.noncrossing import routers
from sparse_attn.modules.noncrossing.config import NoncrossingAttentionConfig
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.noncrossing import key_rows


class RouterInputs(NamedTuple):
    """The pair scorer's features of every point and its weights (`PairScorer`); None for the brick wall.

    u, v: float32[B, H, M, T, r] left- and right-end features (M = N, or 2N half-points when doubled).
    w, c: [H, T, r]; beta: [H, T].
    """

    u: jax.Array
    v: jax.Array
    w: jax.Array
    c: jax.Array
    beta: jax.Array


class EdgeMLP(NamedTuple):
    """Logits from a small MLP on q_a ⊙ k_b: w1 [H, D, E], w2 [H, E]."""

    w1: jax.Array
    w2: jax.Array


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


def route(
    cfg: NoncrossingAttentionConfig,
    router: RouterInputs | None,
    valid_len_B: jax.Array,
    *,
    batch: int,
    n: int,
    heads: int,
) -> dict:
    """Per (batch, head) diagrams and router outputs, stacked [B, H, ...] (`routers` documents the fields)."""
    if cfg.router == "brick_wall":
        r = routers.brick_wall_router(n, cfg.num_route_layers, cfg.brick_start)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (batch, heads) + a.shape), r)
    limit_B = 2 * valid_len_B if cfg.doubled else valid_len_B
    sg = jax.lax.stop_gradient  # the construction is discrete: key_row_pattern recomputes the gates differentiably
    if cfg.router == "defect_pair":
        fn = functools.partial(routers.defect_pair_router, tau=cfg.tau)
    else:
        fn = functools.partial(routers.adjacent_router, tau=cfg.tau, k=max(1, math.ceil(cfg.topk_fraction * n)))
    per_head = jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, None))
    u, v, w, c, beta = (sg(a) for a in router)
    routed = jax.vmap(per_head, in_axes=(0, 0, None, None, None, 0))(u, v, w, c, beta, limit_B)
    return dict(routed, u=router.u, v=router.v)


def key_row_pattern(
    cfg: NoncrossingAttentionConfig, routed: dict, router: RouterInputs | None, valid_len_B: jax.Array
) -> NeighbourList:
    """The neighbour list [B, H, N, K] of the routed diagrams, creator gates as slot biases."""
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
    if not cfg.creator_gate or router is None:
        return NeighbourList(idx=idx, valid=valid)
    gate = jax.vmap(routers.creator_gate, in_axes=(0, 0, 0, 0, 0, 0, 0))  # heads
    gate = jax.vmap(gate, in_axes=(0, 0, 0, 0, None, None, None))  # batch
    gate_BxHx2M = gate(routed["creator"], routed["right"], routed["u"], routed["v"], router.w, router.c, router.beta)
    bias = jax.vmap(jax.vmap(key_rows.row_bias))(gate_BxHx2M, src)
    return NeighbourList(idx=idx, valid=valid, bias=bias)


def edge_mlp_attention(q, k, v, rows: NeighbourList, edge: EdgeMLP) -> jax.Array:
    """Attention over the key rows with logits w2 · gelu(W1ᵀ (q_a ⊙ k_b)) (+ the slot bias)."""
    b, n, h, d = q.shape
    g = k.shape[2]
    grp = jnp.arange(h) // (h // g)
    bi = jnp.arange(b).reshape(b, 1, 1, 1)
    kg = k[bi, rows.idx, grp.reshape(1, h, 1, 1)]  # [B, H, N, K, D]
    vg = v[bi, rows.idx, grp.reshape(1, h, 1, 1)]
    qk = q.transpose(0, 2, 1, 3)[:, :, :, None] * kg
    hid = jax.nn.gelu(jnp.einsum("bhnkd,hde->bhnke", qk.astype(jnp.float32), edge.w1))
    s = jnp.einsum("bhnke,he->bhnk", hid, edge.w2)
    if rows.bias is not None:
        s = s + rows.bias
    p, _ = masked_softmax(s, rows.valid)
    o = jnp.einsum("bhnk,bhnkd->bnhd", p, vg.astype(jnp.float32))
    return o.astype(q.dtype)


def noncrossing_core(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    v_BxNxGxD: jax.Array,
    router: RouterInputs | None,
    valid_len_B: jax.Array,
    cfg: NoncrossingAttentionConfig,
    *,
    edge: EdgeMLP | None = None,
) -> tuple[jax.Array, dict]:
    """Router -> diagrams -> key rows -> attention: (o [B, N, H, D], aux {"routed": dict, "rows": NeighbourList}).

    `valid_len_B` must lie in [0, N] (`checked_valid_len`); the router's features must come from hidden states
    whose padded positions were selected to 0. Padded positions may hold anything (NaN included) in q, k, v: they are
    selected to 0, padded query rows output 0, and every masked slot of a row is pointed at the row itself, so that
    whatever an executor does with a masked slot it reads nothing the row may not read.
    """
    b, n, h = q_BxNxHxD.shape[:3]
    live = jnp.arange(n)[None, :] < valid_len_B[:, None]  # [B, N]
    zero_pad = lambda a: jnp.where(live[:, :, None, None], a, jnp.zeros((), a.dtype))  # noqa: E731
    q, k, v = map(zero_pad, (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD))
    routed = route(cfg, router, valid_len_B, batch=b, n=n, heads=h)
    rows = key_row_pattern(cfg, routed, router, valid_len_B)
    own = jnp.arange(n, dtype=rows.idx.dtype)[None, None, :, None]
    rows = dataclasses.replace(rows, idx=jnp.where(rows.valid, rows.idx, own))
    if edge is not None:
        o = edge_mlp_attention(q, k, v, rows, edge)
    elif cfg.rows == "through":
        o = attention(q, k, v, NeighbourList(rows.idx, rows.valid), implementation=cfg.implementation)
        if rows.bias is not None:  # a softmax over one key is 1: gate the single arc by σ(score) instead
            o = o * jnp.exp(rows.bias[..., 0]).transpose(0, 2, 1)[..., None].astype(o.dtype)
    else:
        o = attention(q, k, v, rows, implementation=cfg.implementation)
    return jnp.where(live[..., None, None], o, jnp.zeros((), o.dtype)), {"routed": routed, "rows": rows}
