"""Temperley–Lieb diagrams in JAX (jit/vmap): sequential ``lax.scan`` and parallel pointer-jumping layers.

Same conventions as ``diagram_np`` (the oracle): ``p_2N`` int32 partner array, top a = a, bottom b = n + b.
Functions here act on one diagram; ``jax.vmap`` them for batches and heads.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns.noncrossing import diagram_np


def identity(n: int) -> jax.Array:
    a = jnp.arange(n, dtype=jnp.int32)
    return jnp.concatenate([a + n, a])


def rmul_gen(p_2N: jax.Array, i) -> tuple[jax.Array, jax.Array]:
    """``D · e_i`` in O(1) and the loop formed (int32 0/1).

    With the bottom cup (i, i+1) already present the four writes below rewrite the same values, so no branch is
    needed: the diagram is unchanged and one loop closes.
    """
    n = p_2N.shape[0] // 2
    x, y = n + i, n + i + 1
    a, b = p_2N[x], p_2N[y]
    p = p_2N.at[a].set(b).at[b].set(a).at[x].set(y).at[y].set(x)
    return p, (a == y).astype(jnp.int32)


def _check_host_word(word_T, n: int) -> None:
    """Host-side validation when the word is concrete; rank and dtype are checked even when traced."""
    if word_T.ndim != 1:
        raise ValueError(f"word must be 1-D (a sequence of generator indices), got shape {word_T.shape}")
    if not jnp.issubdtype(word_T.dtype, jnp.integer):
        raise ValueError(f"word must have an integer dtype, got {word_T.dtype}")
    if not isinstance(word_T, jax.core.Tracer):
        diagram_np.check_word(np.asarray(word_T), n)


def word_to_diagram(word_T, n: int, valid_T=None) -> tuple[jax.Array, jax.Array]:
    """``D(w)`` and its loop count by a ``lax.scan`` of ``rmul_gen``.

    Args:
      word_T: int[T] generator indices in ``0..n-2`` (checked on the host when concrete).
      n: number of strands (static).
      valid_T: optional bool[T]; False entries are skipped (padding for ragged words).
    Returns:
      (p int32[2n], loops int32 scalar).
    """
    word_T = jnp.asarray(word_T) if not isinstance(word_T, jax.Array) else word_T
    _check_host_word(word_T, n)
    if n < 2:
        return identity(n), jnp.zeros((), jnp.int32)
    if valid_T is None:
        valid_T = jnp.ones(word_T.shape, bool)
    # Clip so padding never indexes out of range; those steps are discarded below.
    word_T = jnp.clip(word_T.astype(jnp.int32), 0, n - 2)

    def step(carry, inp):
        p, loops = carry
        i, ok = inp
        p_new, loop = rmul_gen(p, i)
        return (jnp.where(ok, p_new, p), loops + jnp.where(ok, loop, 0)), None

    (p, loops), _ = jax.lax.scan(step, (identity(n), jnp.zeros((), jnp.int32)), (word_T, valid_T))
    return p, loops


def _num_doublings(n: int) -> int:
    return math.ceil(math.log2(2 * n)) + 1


def apply_layer(
    p_2N: jax.Array, sel_M: jax.Array, creator_2N: jax.Array | None = None, gen_id_M: jax.Array | None = None
):
    """``D · Π_{i ∈ S} e_i`` for an independent set S (no two adjacent generators) by pointer jumping.

    O(n log n) work at O(log n) depth (docs/noncrossing.md, "Diagram algebra"). The layer is assumed
    independent (the routers guarantee it; ``local_max`` selections always are).

    Args:
      p_2N: int32[2n] diagram.
      sel_M: bool[n-1], generator i selected.
      creator_2N: optional int32[2n], id of the generator instance that created each point's arc (-1: none).
      gen_id_M: int32[n-1] ids of this layer's generators (needed with ``creator_2N``). A joined arc records the
        largest id on its path: the last generator a sequential, increasing-index application would apply.
    Returns:
      (p int32[2n], loops int32) or, with creators, (p, creator, loops).
    """
    n = p_2N.shape[0] // 2
    sel_M = sel_M.astype(bool)
    zero = jnp.zeros((1,), bool)
    left_N = jnp.concatenate([sel_M, zero])  # bottom x is the left end of a selected cap
    right_N = jnp.concatenate([zero, sel_M])  # bottom x is the right end
    cov_N = left_N | right_N
    pos = jnp.arange(n, dtype=jnp.int32)
    mate_N = jnp.where(left_N, pos + 1, jnp.where(right_N, pos - 1, pos))
    pts = jnp.arange(2 * n, dtype=jnp.int32)
    cov_2N = jnp.concatenate([jnp.zeros((n,), bool), cov_N])
    # A path reaching covered bottom x crosses the layer's top cap to mate(x) and leaves through D's partner.
    nxt = jnp.where(cov_2N, p_2N[n + jnp.concatenate([pos, mate_N])], pts)
    with_creator = creator_2N is not None
    if with_creator:
        none = jnp.full((1,), -1, jnp.int32)
        gid_N = jnp.where(
            left_N, jnp.concatenate([gen_id_M, none]), jnp.where(right_N, jnp.concatenate([none, gen_id_M]), -1)
        )
        cmax = jnp.where(cov_2N, jnp.concatenate([jnp.full((n,), -1, jnp.int32), gid_N]), -1)
    low = jnp.where(cov_2N, pts, 2 * n)  # smallest point on the path so far: finds one label per cycle
    for _ in range(_num_doublings(n)):
        if with_creator:
            cmax = jnp.maximum(cmax, cmax[nxt])
        low = jnp.minimum(low, low[nxt])
        nxt = nxt[nxt]
    # Terminals (tops, uncovered bottoms) are fixed points; covered points still pointing at covered points lie on
    # closed loops. Each loop is two cycles of `nxt` (one per direction round the loop).
    on_cycle = cov_2N & cov_2N[nxt]
    loops = jnp.sum(on_cycle & (low == pts)).astype(jnp.int32) // 2
    end_2N = nxt[p_2N]  # new partner of every terminal point
    cup_2N = jnp.concatenate([pts[:n], n + mate_N])
    p_new = jnp.where(cov_2N, cup_2N, end_2N)
    if not with_creator:
        return p_new, loops
    crossed = cov_2N[p_2N]
    c_new = jnp.where(
        cov_2N, jnp.concatenate([jnp.full((n,), -1, jnp.int32), gid_N]), jnp.where(crossed, cmax[p_2N], creator_2N)
    )
    return p_new, c_new, loops


def layers_to_diagram(sel_LxM: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Diagram of a stack of independent layers (row t = layer t, top first) via pointer jumping."""
    n = sel_LxM.shape[1] + 1

    def step(carry, sel_M):
        p, loops = carry
        p, lp = apply_layer(p, sel_M)
        return (p, loops + lp), None

    (p, loops), _ = jax.lax.scan(step, (identity(n), jnp.zeros((), jnp.int32)), sel_LxM)
    return p, loops
