"""Block selection: per-(query group, key block) scores and a top-k -> a `BlockLayout` (MoBA-style routing).

The sequence's keys are cut into key blocks of `block_size` tokens and its queries into query groups of
`query_block` tokens (`query_block` divides `block_size`, so a group lies inside one key block: its *own* block).
Each query group keeps `top_k` key blocks: the forced ones (its own block, the first `sink_blocks` blocks and
the eligible blocks at most `recent_blocks` blocks from its own: NSA's "local blocks") and the best-scored
eligible others. Query i may attend key j iff

    valid(i) and valid(j) and (not causal or j <= i)
    and (block(j) == own(i) or block(j) in selected(group(i)))

A key block is *eligible* for a group when it holds a valid key and, if causal, lies wholly before the own block
(no later block is ever selected; the own block is attended causally). Valid groups are those with a valid first
query; padded groups select nothing. Among the eligible non-forced blocks the `top_k - #forced` highest scores win;
ties go to the lower block index, a NaN score ranks with -inf (last), and `top_k >= #eligible` keeps them all.

The layout is built at tile resolution (`block_q = block_k = tile`, `tile` dividing `query_block`): the own-block
clause is its `Intervals` mask (`reach` = the own block), the selected non-own blocks its `random_blocks`, so every
executor that runs a `BlockLayout` ("reference", "xla", "pallas") runs it, and `to_dense()` is its oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals

_FORCED, _ELIGIBLE, _OUT = 0, 1, 2  # sort classes: forced blocks first, ineligible ones never selected


def check_blocks(block_size: int, query_block: int | None = None, tile: int | None = None) -> tuple[int, int, int]:
    """(block_size, query_block, tile) as static ints with tile | query_block | block_size, else ValueError naming
    the argument. Defaults: `query_block = block_size`; `tile = query_block`, halved while even and above 128."""
    block_size = common.static_int("block_size", block_size, low=1)
    query_block = common.static_int("query_block", block_size if query_block is None else query_block, low=1)
    if block_size % query_block:
        raise ValueError(f"query_block ({query_block}) must divide block_size ({block_size})")
    if tile is None:
        tile = query_block
        while tile > 128 and tile % 2 == 0:
            tile //= 2
    tile = common.static_int("tile", tile, low=1)
    if query_block % tile:
        raise ValueError(f"tile ({tile}) must divide query_block ({query_block}) and so block_size ({block_size})")
    return block_size, query_block, tile


def check_top_k(top_k: int, sink_blocks: int = 0, recent_blocks: int = 0, *, name: str = "top_k") -> tuple[int, int]:
    """(top_k, sink_blocks) as static ints; the forced blocks (own + sinks + recent) count toward top_k (called
    `name` in the messages: NSA's is top_n)."""
    top_k = common.static_int(name, top_k, low=1, why=f" (the own block is one of the {name} blocks)")
    sink_blocks = common.static_int("sink_blocks", sink_blocks)
    recent_blocks = common.static_int("recent_blocks", recent_blocks)
    if sink_blocks + recent_blocks + 1 > top_k:
        raise ValueError(
            f"{name} ({top_k}) must be >= 1 + sink_blocks ({sink_blocks}) + recent_blocks ({recent_blocks}): the "
            "own block, the sinks and the recent blocks count toward it"
        )
    return top_k, sink_blocks


def num_blocks(n: int, block: int) -> int:
    return -(-n // block)


def select_blocks(
    scores_BxHxQsxKb: jax.Array,
    n: int,
    top_k: int,
    block_size: int,
    *,
    query_block: int | None = None,
    causal: bool = False,
    valid_len=None,
    sink_blocks: int = 0,
    recent_blocks: int = 0,
) -> jax.Array:
    """bool[B', H', Qs, Kb]: the key blocks each query group keeps (own block and sinks included).

    Args:
      scores_BxHxQsxKb: float[B|1, H|1, ceil(n / query_block), ceil(n / block_size)] gate scores (higher is
        better; read, never differentiated).
      n: sequence length; top_k: blocks kept per group, forced ones included (>= 1 + sink_blocks).
      valid_len: int32[B|1] or None; causal, sink_blocks, recent_blocks: as in the module docstring (recent:
        the eligible blocks own - r ... own - 1, and when not causal also own + 1 ... own + r).
    """
    n = common.static_int("n (sequence length)", n, low=1)
    block_size, query_block, _ = check_blocks(block_size, query_block)
    top_k, sink_blocks = check_top_k(top_k, sink_blocks, recent_blocks)
    valid_len = common.valid_len_array(valid_len, n)
    nqs, nkb = num_blocks(n, query_block), num_blocks(n, block_size)
    s = jnp.asarray(scores_BxHxQsxKb)
    if not jnp.issubdtype(s.dtype, jnp.floating) or s.ndim != 4 or s.shape[2:] != (nqs, nkb):
        raise ValueError(
            f"scores must be float[B|1, H|1, {nqs}, {nkb}] (query groups of {query_block}, key blocks of "
            f"{block_size} over n={n}), got {s.dtype}{s.shape}"
        )
    common.check_batches(scores=s.shape[0], valid_len=None if valid_len is None else valid_len.shape[0])
    s = jax.lax.stop_gradient(s).astype(jnp.float32)

    vl = jnp.full((1,), n, jnp.int32) if valid_len is None else valid_len
    vl = vl.reshape(-1, 1, 1, 1)
    q0 = (jnp.arange(nqs, dtype=jnp.int32) * query_block).reshape(1, 1, nqs, 1)
    kb = jnp.arange(nkb, dtype=jnp.int32).reshape(1, 1, 1, nkb)
    cls = _classes(q0, kb, block_size, vl, causal=causal, sink_blocks=sink_blocks, recent_blocks=recent_blocks)
    return _keep(cls, s, top_k)


def select_group(
    scores_BxHxKb, q0, top_k: int, block_size: int, *, sink_blocks: int = 0, recent_blocks: int = 0
) -> jax.Array:
    """bool[B, H, Kb]: the causal selection of the one query group whose first query is `q0` (int32[], may be
    traced): row `q0 // query_block` of `select_blocks(..., causal=True)` on full sequences, for a decoder that
    selects as it goes (every block it may choose lies before `q0`, so it is complete)."""
    top_k, sink_blocks = check_top_k(top_k, sink_blocks, recent_blocks)
    s = jax.lax.stop_gradient(jnp.asarray(scores_BxHxKb)).astype(jnp.float32)[:, :, None, :]
    kb = jnp.arange(s.shape[-1], dtype=jnp.int32).reshape(1, 1, 1, -1)
    q0 = jnp.asarray(q0, jnp.int32).reshape(1, 1, 1, 1)
    cls = _classes(q0, kb, block_size, q0 + 1, causal=True, sink_blocks=sink_blocks, recent_blocks=recent_blocks)
    return _keep(cls, s, top_k)[:, :, 0]


def _classes(q0, kb, block_size: int, vl, *, causal: bool, sink_blocks: int, recent_blocks: int):
    """int32 class of each (group, key block): forced, eligible or out (the module docstring's rule)."""
    own = q0 // block_size
    group_ok = q0 < vl
    eligible = group_ok & (kb * block_size < vl) & ((kb < own) if causal else (kb != own))
    recent = jnp.abs(kb - own) <= recent_blocks
    forced = group_ok & ((kb == own) | (eligible & ((kb < sink_blocks) | recent)))
    return jnp.where(forced, _FORCED, jnp.where(eligible, _ELIGIBLE, _OUT)).astype(jnp.int32)


def _keep(cls, s, top_k: int):
    """bool: the top_k blocks by (class, score), NaN scores ranking with -inf, ties to the lower block index."""
    lead = jnp.broadcast_shapes(cls.shape, s.shape)
    cls = jnp.broadcast_to(cls, lead)
    neg = -s
    neg = jnp.broadcast_to(jnp.where(jnp.isnan(neg), jnp.inf, neg), lead)  # NaN ranks with -inf
    iota = jnp.broadcast_to(jnp.arange(lead[-1], dtype=jnp.int32), lead)
    # One stable sort by (class, -score); ties keep the lower block index first.
    _, _, order = jax.lax.sort((cls, neg, iota), dimension=-1, is_stable=True, num_keys=2)
    rank = jnp.argsort(order, axis=-1).astype(jnp.int32)
    return (rank < top_k) & (cls != _OUT)


def own_block_mask(n: int, block_size: int, *, causal: bool, valid_len=None) -> Intervals:
    """The own-block clause as Intervals: query i attends its block's keys (causal: up to i); padded rows none."""
    i = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, n)
    lo = (i // block_size) * block_size
    hi = i if causal else jnp.minimum(lo + block_size - 1, n - 1)
    if valid_len is not None:
        vl = valid_len.reshape(-1, 1, 1)
        dead = i >= vl
        lo, hi = jnp.where(dead, 1, lo), jnp.where(dead, 0, jnp.minimum(hi, vl - 1))
    reach = (block_size - 1, 0 if causal else block_size - 1)
    return Intervals(lo, hi, valid_len=valid_len, causal=causal, reach=reach)


def layout_from_selection(
    selected_BxHxQsxKb: jax.Array,
    n: int,
    top_k: int,
    block_size: int,
    *,
    query_block: int | None = None,
    tile: int | None = None,
    causal: bool = False,
    valid_len=None,
) -> BlockLayout:
    """The `BlockLayout` of a block selection (`select_blocks`) at tile resolution, built on device.

    Its mask is `own_block_mask`; its random blocks the selected non-own blocks expanded to tiles, at most
    `min(top_k - 1, blocks - 1) * block_size / tile` per query tile (`max_random`): a top_k past the sequence's
    blocks keeps every block.
    """
    n = common.static_int("n (sequence length)", n, low=1)
    block_size, query_block, tile = check_blocks(block_size, query_block, tile)
    valid_len = common.valid_len_array(valid_len, n)
    sel = jnp.asarray(selected_BxHxQsxKb)
    nqs, nkb = num_blocks(n, query_block), num_blocks(n, block_size)
    if sel.dtype != jnp.bool_ or sel.ndim != 4 or sel.shape[2:] != (nqs, nkb):
        raise ValueError(f"selected must be bool[B|1, H|1, {nqs}, {nkb}], got {sel.dtype}{sel.shape}")
    nt = num_blocks(n, tile)
    t0 = jnp.arange(nt, dtype=jnp.int32) * tile
    qs_of_tile, kb_of_tile = t0 // query_block, t0 // block_size
    not_own = kb_of_tile[None, :] != (qs_of_tile * query_block // block_size)[:, None]  # [Qt, Kt]
    rb = sel[:, :, qs_of_tile][:, :, :, kb_of_tile] & not_own[None, None]
    mask = own_block_mask(n, block_size, causal=causal, valid_len=valid_len)
    # Other blocks a group can hold: top_k - 1, and never more than exist (a short sequence under a large top_k).
    max_random = min(top_k - 1, nkb - 1) * (block_size // tile)
    return BlockLayout.from_intervals(mask, tile, tile, random_blocks=rb, max_random=max_random)


def block_select(
    scores_BxHxQsxKb: jax.Array,
    n: int,
    top_k: int,
    block_size: int,
    *,
    query_block: int | None = None,
    tile: int | None = None,
    causal: bool = False,
    valid_len=None,
    sink_blocks: int = 0,
    recent_blocks: int = 0,
) -> BlockLayout:
    """Scores -> top-k key blocks per query group -> `BlockLayout` (module docstring). Pure and jit-able.

    Args:
      scores_BxHxQsxKb: float[B|1, H|1, ceil(n / query_block), ceil(n / block_size)] (per-head when H > 1).
      n: sequence length; top_k: key blocks kept per query group, own block and sinks included.
      block_size: key block size; query_block: query group size (divides block_size; default block_size).
      tile: the layout's block size (divides query_block; default `check_blocks`).
      causal: no key after its query; valid_len: int32[B|1] or None; sink_blocks: first blocks always kept;
      recent_blocks: the blocks nearest the own block always kept (`select_blocks`).

    Returns:
      a BlockLayout with block_q = block_k = tile; `to_dense()` is its element rule.
    """
    sel = select_blocks(
        scores_BxHxQsxKb, n, top_k, block_size, query_block=query_block, causal=causal, valid_len=valid_len,
        sink_blocks=sink_blocks, recent_blocks=recent_blocks,
    )  # fmt: skip
    return layout_from_selection(
        sel, n, top_k, block_size, query_block=query_block, tile=tile, causal=causal, valid_len=valid_len
    )
