"""Position labels: fixed extra labels that keep every near pair of the window, whatever the router says.

Each token gets two more labels, its cell in two grids of `cell` positions offset by cell/2, numbered modulo M:
  grid 1: L + (u // cell) mod M        grid 2: L + M + ((u + cell/2) // cell) mod M
The grids' boundaries alternate every cell/2 positions, so a pair closer than cell/2 straddles at most one of them
and shares the other grid's cell: **every pair with |u - v| < cell/2 shares a position label**. Two different cells
with the same number are at least (M - 1) cell + 1 > radius apart (M = ceil(radius / cell) + 1), so inside the
window a position label is shared only within a cell (pairs up to cell - 1 apart). Landmark edges reach beyond the
window, where the numbering repeats: a landmark whose cell number matches the query's is allowed too — a few more
global edges, and the pattern stays an exact label intersection that every executor and the decoder run unchanged.

In the soft phases the position labels are memberships fixed at 1 (q_uv = 1 on those pairs: no penalty), and the
router never sees them: its losses, statistics and top-k are over its own L labels.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def cells_per_grid(cell: int, radius: int) -> int:
    """M: cell numbers per grid, so that two cells with one number are farther apart than the window."""
    return math.ceil(radius / cell) + 1


def num_position_labels(cell: int, radius: int) -> int:
    """2 M (0 when `cell` is 0: no position labels)."""
    return 2 * cells_per_grid(cell, radius) if cell else 0


def check_cell(cell: int, radius: int, num_labels: int, max_labels: int) -> None:
    """ValueError unless `cell` is 0 (off) or an even int >= 2 whose labels fit beside the router's."""
    if not isinstance(cell, int) or isinstance(cell, bool) or cell < 0 or cell % 2:
        raise ValueError(f"position_cell must be 0 (off) or an even int >= 2, got {cell!r}")
    total = num_labels + num_position_labels(cell, radius)
    if total > max_labels:
        raise ValueError(f"num_labels ({num_labels}) + position labels ({total - num_labels} for position_cell={cell}, "
                         f"radius={radius}) = {total} exceeds {max_labels}: use a larger position_cell or fewer "
                         "labels")


def position_labels(pos_N: jax.Array, cell: int, radius: int, offset: int) -> jax.Array:
    """int32[N, 2]: the two position labels of each position, numbered from `offset` (the router's L)."""
    m = cells_per_grid(cell, radius)
    pos = pos_N.astype(jnp.int32)
    return jnp.stack([offset + (pos // cell) % m, offset + m + ((pos + cell // 2) // cell) % m], axis=-1)


def position_memberships(pos_N: jax.Array, cell: int, radius: int, dtype=jnp.float32) -> jax.Array:
    """[N, 2M]: the position labels as memberships (one-hot per grid), to append to the router's p."""
    lab = position_labels(pos_N, cell, radius, 0)
    return jax.nn.one_hot(lab, num_position_labels(cell, radius), dtype=dtype).sum(axis=-2)


def with_position_labels(labels_xNxK: jax.Array, p_xNxL: jax.Array, cell: int, radius: int):
    """(labels int32[..., N, K + 2], p [..., N, L + 2M], total labels L + 2M): the router's top-k labels and
    memberships with the position labels appended (labels stay ascending: the router's are all < L)."""
    n, num_labels = p_xNxL.shape[-2], p_xNxL.shape[-1]
    pos = jnp.arange(n, dtype=jnp.int32)
    extra = jnp.broadcast_to(position_labels(pos, cell, radius, num_labels), labels_xNxK.shape[:-1] + (2,))
    mem = jnp.broadcast_to(position_memberships(pos, cell, radius, p_xNxL.dtype),
                           p_xNxL.shape[:-1] + (num_position_labels(cell, radius),))
    total = num_labels + num_position_labels(cell, radius)
    return (jnp.concatenate([labels_xNxK, extra.astype(labels_xNxK.dtype)], axis=-1),
            jnp.concatenate([p_xNxL, mem], axis=-1), total)
