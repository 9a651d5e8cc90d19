"""Per-batch statistics of non-crossing attention (docs/noncrossing.md, "Statistics"), unprefixed."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.modules.base import keys_per_query
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.noncrossing import stats
from sparse_attn.patterns.stats import key_counts


def noncrossing_stats(routed: dict, rows: NeighbourList, valid_len_B: jax.Array) -> dict:
    """float32 scalars: `keys_per_query` (valid slots of the key rows: self and routed partners), the mean per
    (sequence, head) of surviving non-self `arcs`, diagram `rank`, closed `loops`, `word_length` (generators
    applied), `pairs` (pairs closed by the router), and the largest cap `nesting_depth` in the batch."""
    ds = jax.vmap(jax.vmap(stats.diagram_stats))(routed["p"])
    arcs = jax.vmap(jax.vmap(stats.surviving_arcs))(rows.idx, rows.valid)
    keys, _ = key_counts(rows)
    f32 = lambda a: jnp.mean(a.astype(jnp.float32))  # noqa: E731
    return dict(
        keys_per_query=keys_per_query(keys, valid_len_B),
        arcs=f32(arcs),
        rank=f32(ds["rank"]),
        loops=f32(routed["loops"]),
        word_length=f32(routed["word_length"]),
        pairs=f32(routed["pairs"]),
        nesting_depth=jnp.max(ds["nesting_depth"]).astype(jnp.float32),
    )
