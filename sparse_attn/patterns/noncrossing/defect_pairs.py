"""The defect-pair construction in JAX: close chosen pairs of adjacent unmatched strands (docs/noncrossing.md,
"Diagram algebra").

At each layer the defects (top points on through-strands) d_1 < … < d_p are scored pairwise, a non-adjacent set of
pairs is chosen by the local-max rule, and each chosen pair (d_j, d_{j+1}) is realised by TL generators: e_x at the
bottom end x of d_j plus e_r at the right end r of every outermost bottom cup between the two bottom ends. The new
top cap is exactly (d_j, d_{j+1}); other defects keep their order; T layers nest brackets up to depth T.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sparse_attn.patterns.noncrossing import diagram_jax, selection


def defects(p_2N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(is_defect bool[n], prev int32[n], next int32[n]): previous / next top defect of each slot (-1 / n: none)."""
    n = p_2N.shape[0] // 2
    pos = jnp.arange(n, dtype=jnp.int32)
    is_def = p_2N[:n] >= n
    cmin = jax.lax.cummin(jnp.where(is_def, pos, n), reverse=True)  # first defect at or after x
    nxt = jnp.concatenate([cmin[1:], jnp.full((1,), n, jnp.int32)])
    cmax = jax.lax.cummax(jnp.where(is_def, pos, -1))  # last defect at or before x
    prv = jnp.concatenate([jnp.full((1,), -1, jnp.int32), cmax[:-1]])
    return is_def, prv, nxt


def layer_generators(p_2N: jax.Array, sel_top_N: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Generators realising the selected pairs: (gens bool[n], owner int32[n] = top defect of each generator's pair)."""
    n = p_2N.shape[0] // 2
    pos = jnp.arange(n, dtype=jnp.int32)
    is_def = p_2N[:n] >= n
    bot = jnp.where(is_def, p_2N[:n] - n, n)  # bottom end of each top defect (order preserving)
    top_of_bot = jnp.full((n,), -1, jnp.int32).at[bot].set(pos, mode="drop")
    pb = p_2N[n:]
    is_bdef = pb < n
    left_end = (pb >= n) & (pb - n > pos)
    right_end = (pb >= n) & (pb - n < pos)
    depth = jnp.cumsum(left_end.astype(jnp.int32) - right_end.astype(jnp.int32))
    outer_right = right_end & (depth == 0)  # cups never enclose a defect, so depth 0 = outermost
    last_bdef = jax.lax.cummax(jnp.where(is_bdef, pos, -1))
    owner = jnp.where(last_bdef >= 0, top_of_bot[jnp.maximum(last_bdef, 0)], -1)
    owner_sel = (owner >= 0) & sel_top_N[jnp.maximum(owner, 0)]
    gens = owner_sel & (is_bdef | outer_right)
    return gens, owner


def _direct_update(p_2N, creator_2N, sel_top_N, gens_N, owner_N, prv_N, nxt_N, layer):
    """The layer's product in O(n) without pointer jumping, using the construction's structure.

    Chosen pairs become top caps; every generator x leaves the bottom cup (x, x+1); the outermost cups it consumed
    disappear; everything else (other defects, inner cups, old caps) is untouched; no loop can close. Every arc the
    pair's generators create records the pair's id ``layer * n + left defect``.
    """
    n = p_2N.shape[0] // 2
    pos = jnp.arange(n, dtype=jnp.int32)
    top = p_2N[:n]
    is_right = (top >= n) & (prv_N >= 0) & sel_top_N[jnp.maximum(prv_N, 0)]
    top_new = jnp.where(sel_top_N, nxt_N, jnp.where(is_right, prv_N, top))
    gen_left = gens_N
    gen_right = jnp.concatenate([jnp.zeros((1,), bool), gens_N[:-1]])
    cov = gen_left | gen_right
    mate = jnp.where(gen_left, pos + 1, pos - 1)
    bot_new = jnp.where(cov, n + mate, p_2N[n:])
    c_top = jnp.where(sel_top_N, layer * n + pos, jnp.where(is_right, layer * n + prv_N, creator_2N[:n]))
    gen_of = jnp.where(gen_left, pos, pos - 1)  # the generator covering each covered bottom point
    c_bot = jnp.where(cov, layer * n + owner_N[jnp.maximum(gen_of, 0)], creator_2N[n:])
    return jnp.concatenate([top_new, bot_new]), jnp.concatenate([c_top, c_bot])


def defect_pair_layer(p_2N, creator_2N, s_N, limit, layer, tau: float = 0.0, *, direct: bool = True):
    """One routing layer. s_N[x]: score of the pair (x, next defect after x); pairs reaching >= ``limit`` are off.

    ``direct`` uses the O(n) structural update; False applies the generators by pointer jumping (the general TL
    kernel; tests check both agree). Returns (p, creator, loops, s_N, num_generators, num_pairs). Creator ids
    name the pair: ``layer * n + d`` for the pair whose left defect is d, so ``s_N`` indexes them.
    """
    n = p_2N.shape[0] // 2
    is_def, prv, nxt = defects(p_2N)
    ok = is_def & (nxt < limit)
    sel = selection.local_max_on_sequence(s_N, ok, prv, nxt, tau)
    gens, owner = layer_generators(p_2N, sel)
    if direct:
        p, c = _direct_update(p_2N, creator_2N, sel, gens, owner, prv, nxt, layer)
        loops = jnp.zeros((), jnp.int32)
    else:
        ids = layer * n + owner[: n - 1]  # one id per pair: every path crosses one pair's generators only
        p, c, loops = diagram_jax.apply_layer(p_2N, gens[: n - 1], creator_2N, ids)
    return p, c, loops, s_N, jnp.sum(gens, dtype=jnp.int32), jnp.sum(sel, dtype=jnp.int32)


def defect_pair_diagram(
    score_fn: Callable[[int, jax.Array], jax.Array],
    n: int,
    num_layers: int,
    limit=None,
    tau: float = 0.0,
    *,
    direct: bool = True,
):
    """Builds one diagram with ``num_layers`` defect-pair layers.

    Args:
      score_fn: ``score_fn(t, next_N) -> s_N`` (t traced), the layer-t score of each pair (x, next_N[x]) (next_N clipped to
        n-1 where there is none; those entries are ignored).
      n: points per row (tokens, or 2 * tokens for the doubled TL_{2n}).
      limit: pairs must end below it (valid length); default n.
    Returns:
      dict with p int32[2n], creator int32[2n] (pair ids t*n + left defect, -1 for none), gen_scores float[T*n]
      (score of each id; the pair (d, p[d]) of id t*n + d is a top cap of the final diagram), loops, word_length (generators applied), pairs (caps created).
    """
    limit = n if limit is None else limit
    zero = jnp.zeros((), jnp.int32)

    def step(carry, t):  # one compiled layer body, scanned T times
        p, c, loops, word_len, pairs = carry
        _, _, nxt = defects(p)
        s = score_fn(t, jnp.minimum(nxt, n - 1))
        p, c, lp, gs, ng, npairs = defect_pair_layer(p, c, s, limit, t, tau, direct=direct)
        return (p, c, loops + lp, word_len + ng, pairs + npairs), gs

    init = (diagram_jax.identity(n), jnp.full((2 * n,), -1, jnp.int32), zero, zero, zero)
    (p, c, loops, word_len, pairs), gs_TxN = jax.lax.scan(step, init, jnp.arange(num_layers, dtype=jnp.int32))
    return dict(p=p, creator=c, gen_scores=gs_TxN.reshape(-1), loops=loops, word_length=word_len, pairs=pairs)


def creator_gate(creator_2N: jax.Array, gen_scores: jax.Array) -> jax.Array:
    """float[2n]: ``log σ(score of the generator that created each point's arc)``, 0 where no generator did."""
    has = creator_2N >= 0
    s = gen_scores[jnp.maximum(creator_2N, 0)]
    return jnp.where(has, jax.nn.log_sigmoid(s), 0.0)
