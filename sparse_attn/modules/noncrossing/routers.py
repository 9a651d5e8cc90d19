"""Routers: one TL diagram per (batch, head) from the pair scores (pure functions of arrays; vmap over B and H).

Each returns dict(p, creator, gen_scores, loops, word_length, pairs, right): the diagram; for each point the id
``t * m + left`` of the scored pair (left, right[left]) at layer t whose generators created its arc; the score of
every id; counts. The diagrams are built without gradients; ``creator_gate`` recomputes the creators' scores
differentiably, so the backward pass never runs through the T-layer construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.modules.noncrossing.scorer import pair_scores
from sparse_attn.patterns.noncrossing import defect_pairs, diagram_jax, diagram_np, selection


def defect_pair_router(u_MxTxR, v_MxTxR, w_TxR, c_TxR, beta_T, limit, *, tau: float = 0.0) -> dict:
    """The default router (docs/noncrossing.md, "Routers"): layer t scores adjacent unmatched strands and closes
    local-max pairs, so layer t closes the brackets of height t."""
    m, num_layers = u_MxTxR.shape[:2]

    def score(t, nxt_M):
        return pair_scores(u_MxTxR[:, t], v_MxTxR[:, t], nxt_M, w_TxR[t], c_TxR[t], beta_T[t])

    out = defect_pairs.defect_pair_diagram(score, m, num_layers, limit, tau)
    out["right"] = out["p"][:m]  # a pair (d, d') closed at any layer is a top cap of the final diagram
    return out


def adjacent_router(u_MxTxR, v_MxTxR, w_TxR, c_TxR, beta_T, limit, *, tau: float = 0.0, k: int = 1) -> dict:
    """The research document's literal rule, an ablation: layer t scores positions (i, i+1) and applies the k best
    local-max generators.

    After the first layer the strands that e_i joins are no longer tokens i and i+1, so this router cannot build
    nested brackets on purpose (docs/noncrossing.md, "Routers"); it exists for comparison.
    """
    m, num_layers = u_MxTxR.shape[:2]
    pos = jnp.arange(m - 1, dtype=jnp.int32)
    zero = jnp.zeros((), jnp.int32)

    def step(carry, t):
        p, c, loops, word_len = carry
        s = pair_scores(u_MxTxR[:-1, t], v_MxTxR[:, t], pos + 1, w_TxR[t], c_TxR[t], beta_T[t])
        sel = selection.top_k_independent(s, k, pos + 1 < limit, tau)
        p, c, lp = diagram_jax.apply_layer(p, sel, c, t * m + pos)
        return (p, c, loops + lp, word_len + jnp.sum(sel, dtype=jnp.int32)), jnp.concatenate(
            [s, jnp.zeros((1,), s.dtype)]
        )

    init = (diagram_jax.identity(m), jnp.full((2 * m,), -1, jnp.int32), zero, zero)
    (p, c, loops, word_len), gs_TxM = jax.lax.scan(step, init, jnp.arange(num_layers, dtype=jnp.int32))
    return dict(
        p=p,
        creator=c,
        gen_scores=gs_TxM.reshape(-1),
        loops=loops,
        word_length=word_len,
        pairs=word_len,
        right=jnp.minimum(jnp.arange(m, dtype=jnp.int32) + 1, m - 1),
    )


def brick_wall_router(m: int, depth: int, start: str = "even") -> dict:
    """The fixed alternating pattern (no parameters): ring-local attention of radius 1 (docs/noncrossing.md,
    "Routers")."""
    word = diagram_np.brick_wall_word(m, depth, start)
    p, loops = diagram_np.word_to_diagram(np.array(word, np.int64), m)
    return dict(
        p=jnp.asarray(p, jnp.int32),
        creator=jnp.full((2 * m,), -1, jnp.int32),
        gen_scores=jnp.zeros((1,), jnp.float32),
        loops=jnp.asarray(loops, jnp.int32),
        word_length=jnp.asarray(len(word), jnp.int32),
        pairs=jnp.asarray(len(word), jnp.int32),
        right=jnp.arange(m, dtype=jnp.int32),
    )


def creator_gate(creator_2M, right_M, u_MxTxR, v_MxTxR, w_TxR, c_TxR, beta_T) -> jax.Array:
    """float[2m]: ``log σ(φ_t(left, right[left]))`` of each point's creator id ``t * m + left``; 0 without one."""
    m = right_M.shape[0]
    cid = jnp.maximum(creator_2M, 0)
    t, left = cid // m, cid % m
    right = right_M[left]
    h = jax.nn.gelu(u_MxTxR[left, t] + v_MxTxR[right, t] + c_TxR[t])
    s = jnp.sum(h * w_TxR[t], axis=-1) + beta_T[t]
    return jnp.where(creator_2M >= 0, jax.nn.log_sigmoid(s), 0.0)
