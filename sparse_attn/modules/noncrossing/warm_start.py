"""Supervised warm start of the defect-pair router on bracket tasks (docs/noncrossing.md, "Warm start").

Before task training, fit a layer's pair scorers to the known bracket matching: at routing layer t, every pair of
adjacent unmatched strands is labelled by whether it closes a bracket of height t, teacher-forced on the layered
construction (`patterns.noncrossing.layered`), and the scorer's logits are fitted by BCE. It needs the bracket
tokens, so it applies to bracket tasks (Dyck) only; measured on Dyck-(8, 10) it is what lets the classifier learn.

    targets = bracket_targets(opens_BxN, valid_len_B, num_route_layers)   # host, per batch
    loss = warm_start_loss(model.blocks[0].attn, x_BxNxD, targets)        # x: what that layer's router reads
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sparse_attn.modules.noncrossing.module import NoncrossingAttention
from sparse_attn.modules.noncrossing.scorer import pair_scores
from sparse_attn.patterns.noncrossing import diagram_np, layered


def bracket_matching(opens_L: np.ndarray) -> list[tuple[int, int]]:
    """Sorted (open, close) pairs of a balanced bracket shape (True at opening brackets)."""
    stack, caps = [], []
    for i, is_open in enumerate(np.asarray(opens_L).tolist()):
        if is_open:
            stack.append(i)
        elif not stack:
            raise ValueError(f"bracket {i} closes nothing: the shape is not balanced")
        else:
            caps.append((stack.pop(), i))
    if stack:
        raise ValueError(f"{len(stack)} brackets never close: the shape is not balanced")
    return sorted(caps)


def layer_targets(opens_L: np.ndarray, valid_len: int, n: int, num_layers: int):
    """(nxt, y, mask), each [T, n], for one word: per routing layer t, each point's next unmatched strand `nxt`,
    whether that pair closes a bracket of height t + 1, and whether the pair exists inside the valid prefix.
    Teacher-forced: layer t's strands are those the layered construction leaves after layers < t."""
    caps = bracket_matching(opens_L[:valid_len])
    height = layered.cap_heights(caps, n)
    word = layered.layered_word(caps, n)
    p = diagram_np.identity(n)
    nxt_TxN = np.full((num_layers, n), n - 1)  # unused points score a harmless pair; the mask drops them
    y_TxN, m_TxN = np.zeros((num_layers, n), np.float32), np.zeros((num_layers, n), bool)
    for t in range(num_layers):
        defects = [a for a in range(n) if p[a] >= n]  # top points still on through-strands
        for a, b in itertools.pairwise(defects):
            if b >= valid_len:
                break
            nxt_TxN[t, a], m_TxN[t, a], y_TxN[t, a] = b, True, float(height.get((a, b)) == t + 1)
        for i in word[t] if t < len(word) else []:
            diagram_np.rmul_gen(p, i)
    return nxt_TxN, y_TxN, m_TxN


def bracket_targets(opens_BxN: np.ndarray, valid_len_B: np.ndarray, num_layers: int) -> dict[str, jax.Array]:
    """`layer_targets` of a batch, stacked: {"nxt": int[B, T, N], "y": float32[B, T, N], "m": bool[B, T, N]}."""
    opens_BxN = np.asarray(opens_BxN)
    n = opens_BxN.shape[1]
    nxt, y, m = map(np.stack, zip(*(layer_targets(o, int(v), n, num_layers)
                                    for o, v in zip(opens_BxN, np.asarray(valid_len_B), strict=True)), strict=True))
    return {"nxt": jnp.asarray(nxt), "y": jnp.asarray(y), "m": jnp.asarray(m)}


def warm_start_loss(attn: NoncrossingAttention, x_BxNxD: jax.Array, targets: dict[str, jax.Array]) -> jax.Array:
    """Mean teacher-forced BCE of `attn`'s pair scores over every head, routing layer and existing pair.

    `x_BxNxD` is what the layer's router reads (the normalised block input, padding selected to 0); gradients
    flow into the scorer and through `x` into whatever produced it (the embedding, for layer 0)."""
    cfg = attn.config
    if cfg.router != "defect_pair" or cfg.doubled:
        raise ValueError(f"the warm start fits the defect-pair router on n points, not router={cfg.router!r}, "
                         f"doubled={cfg.doubled}")
    if targets["nxt"].shape[1] != cfg.num_route_layers:
        raise ValueError(f"targets for {targets['nxt'].shape[1]} routing layers, the layer has {cfg.num_route_layers}")
    sc = attn.scorer
    u, v = sc.features(x_BxNxD)  # [B, H, N, T, r]
    per_t = jax.vmap(pair_scores, in_axes=(1, 1, 0, 0, 0, 0))  # over T: [N, T, r] -> [T, N]
    per_h = jax.vmap(per_t, in_axes=(0, 0, None, 0, 0, 0))  # over H
    s_BxHxTxN = jax.vmap(per_h, in_axes=(0, 0, 0, None, None, None))(
        u, v, targets["nxt"], sc.w[...], sc.c[...], sc.beta[...])
    bce = optax.sigmoid_binary_cross_entropy(s_BxHxTxN, targets["y"][:, None])
    m = jnp.broadcast_to(targets["m"][:, None], bce.shape)
    return jnp.sum(jnp.where(m, bce, 0.0)) / jnp.maximum(jnp.sum(m), 1)
