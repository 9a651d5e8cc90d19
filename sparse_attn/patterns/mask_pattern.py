"""A pattern from a mask function (FlexAttention's block mask): `from_mask_fn(mask_fn, q_len, kv_len, ...)`.

    pattern = from_mask_fn(and_masks(causal_mask, document_mask(ids_BxN)), n, n, batch=B)
    out = sparse_attn.attention(q, k, v, pattern)             # pays for the blocks the predicate allows

The predicate is traced once on int32 scalars (`jax.make_jaxpr`): the arrays it closes over (document ids, prefix
lengths) become the pattern's pytree leaves (`buffers`) and its program a static `Predicate` that compares equal
for equal code, so a pattern built under `jax.jit` from traced data, or passed to a jitted function, never
recompiles for new buffer values. Blocks of `block_q x block_k` are classified empty / partial / full by evaluating
the predicate blockwise on device, a chunk of query blocks at a time: never an [Nq, Nk] mask at once. Executors visit
the listed blocks only and apply the predicate element-wise on partial ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common, mask_bounds
from sparse_attn.patterns.block_layout import compact_flags

DEFAULT_BLOCK = 128
# Elements of the predicate evaluated at once while classifying blocks (a chunk of whole query blocks): the
# classification's peak memory is about this many bytes (bool) plus the [B', H', Qb, Kb] block states.
CHUNK_ELEMENTS = 1 << 24
EMPTY, PARTIAL, FULL = 0, 1, 2


class Predicate:
    """A mask function's program: the jaxpr of `mask_fn(b, h, q_idx, kv_idx) -> bool` on int32 scalars, without its
    closed-over arrays (those are the pattern's buffers). Static pytree metadata: equal, and hashing equal, for the
    same program text, whatever the buffers hold. `reads_batch` / `reads_heads`: whether it uses b / h at all."""

    def __init__(self, jaxpr, name: str):
        self.jaxpr, self.name = jaxpr, name
        self._key = str(jaxpr)
        used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
        self.reads_batch, self.reads_heads = (id(jaxpr.invars[i]) in used for i in (0, 1))

    def __eq__(self, other):
        return isinstance(other, Predicate) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"Predicate({self.name})"

    def __call__(self, buffers, b, h, q_idx, kv_idx):
        """The predicate on int32 scalars (vmap it for arrays)."""
        return jex.jaxpr_as_fun(jex.ClosedJaxpr(self.jaxpr, list(buffers)))(b, h, q_idx, kv_idx)[0]


def trace_mask_fn(mask_fn: Callable) -> tuple[Predicate, tuple]:
    """(Predicate, buffers) of `mask_fn`; ValueError naming the problem when it is not a predicate of int32 indices
    returning one bool."""
    if not callable(mask_fn):
        raise ValueError(f"mask_fn must be callable as mask_fn(b, h, q_idx, kv_idx) -> bool, got {mask_fn!r}")
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    try:
        closed = jax.make_jaxpr(mask_fn)(i32, i32, i32, i32)
    except Exception as e:  # noqa: BLE001  (any failure to trace is the caller's predicate)
        hint = (" (index jnp arrays, not numpy ones, with the traced indices)"
                if isinstance(e, jax.errors.TracerArrayConversionError) else "")  # fmt: skip
        raise ValueError(f"mask_fn(b, h, q_idx, kv_idx) could not be traced on int32 scalar indices{hint}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0]}") from e  # fmt: skip
    outs = closed.jaxpr.outvars
    if len(outs) != 1:
        raise ValueError(f"mask_fn must return one bool array, got {len(outs)} outputs")
    aval = outs[0].aval
    if aval.dtype != jnp.bool_:
        raise ValueError(f"mask_fn must return bool, got {aval.dtype} (compare, e.g. `kv_idx <= q_idx`)")
    if aval.shape != ():
        raise ValueError(f"mask_fn must return one bool per (b, h, q_idx, kv_idx): on scalar indices it returned "
                         f"shape {aval.shape}")  # fmt: skip
    name = getattr(mask_fn, "__name__", type(mask_fn).__name__)
    return Predicate(closed.jaxpr, name), tuple(closed.consts)


def _grid(predicate: Predicate, buffers, b_B, h_H, q_Q, k_K) -> jax.Array:
    """bool[B, H, Q, K]: the predicate on the outer product of index vectors (nested vmaps: no index arrays of the
    full size are materialised)."""
    f = lambda b, h, q, k: predicate(buffers, b, h, q, k)  # noqa: E731
    for axis in (3, 2, 1, 0):
        f = jax.vmap(f, in_axes=tuple(0 if i == axis else None for i in range(4)))
    return f(b_B, h_H, q_Q, k_K)


def tile_mask(predicate: Predicate, buffers, b, h, q_Q, k_K) -> jax.Array:
    """bool[Q, K]: the predicate for one (batch row, head) on a tile's query and key positions (scalars b, h)."""
    f = lambda q, k: predicate(buffers, b, h, q, k)  # noqa: E731
    return jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(0, None))(q_Q, k_K)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MaskFnPattern:
    """Block lists over a mask function, for queries [0, q_len) and keys [0, kv_len) (cross-attention when they
    differ).

    Attributes:
      predicate: the mask function's program (static); `buffers`: the arrays it closes over (pytree leaves).
      block_state: int8[B', H', Qb, Kb]: EMPTY, PARTIAL or FULL per (query block, key block); B' = batch or 1 (the
        mask does not depend on b: evaluated at b = 0), H' likewise.
      kv_count, kv_idx: int32[B', H', Qb], int32[B', H', Qb, C] partial key blocks of each query block (ascending,
        padded by repeating the last); full_count, full_idx: the full ones [.., Cf]. A count above its list's width
        (a `capacity` too small for the data) makes that query block's rows NaN in every executor.
      q_len, kv_len, block_q, block_k: static sizes.
    """

    predicate: Predicate = dataclasses.field(metadata=dict(static=True))
    buffers: tuple
    block_state: jax.Array
    kv_count: jax.Array
    kv_idx: jax.Array
    full_count: jax.Array
    full_idx: jax.Array
    q_len: int = dataclasses.field(metadata=dict(static=True))
    kv_len: int = dataclasses.field(metadata=dict(static=True))
    block_q: int = dataclasses.field(metadata=dict(static=True))
    block_k: int = dataclasses.field(metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        """The query length (what `attention` checks q against)."""
        return self.q_len

    @property
    def num_kv_tokens(self) -> int:
        return self.kv_len

    def validate(self, batch: int | None = None, heads: int | None = None) -> MaskFnPattern:
        common.check_lead("MaskFnPattern (the batch/heads it was built for)", self.block_state.shape, batch, heads)
        if common.is_concrete(self.kv_count, self.full_count):
            over = int(np.sum(np.maximum(common.host(self.kv_count) - self.kv_idx.shape[-1], 0))
                       + np.sum(np.maximum(common.host(self.full_count) - self.full_idx.shape[-1], 0)))  # fmt: skip
            if over:
                raise ValueError(f"MaskFnPattern: {over} key blocks exceed the list capacity (from_mask_fn(..., "
                                 f"capacity=...) too small: widths {self.kv_idx.shape[-1]}, "
                                 f"{self.full_idx.shape[-1]})")  # fmt: skip
        return self

    def allowed(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool[B', H', X, Q, K] for positions [L, L', X, Q] and [L, L', X, K] (out-of-range positions: False)."""
        bs, hs = self.block_state.shape[:2]
        lead = jnp.broadcast_shapes(q_pos.shape[:-1], k_pos.shape[:-1])
        q = jnp.broadcast_to(q_pos, lead + q_pos.shape[-1:])
        k = jnp.broadcast_to(k_pos, lead + k_pos.shape[-1:])
        b = jnp.broadcast_to(jnp.arange(bs, dtype=jnp.int32).reshape(-1, 1, 1), (bs, hs, 1))
        h = jnp.broadcast_to(jnp.arange(hs, dtype=jnp.int32).reshape(1, -1, 1), (bs, hs, 1))
        q = jnp.broadcast_to(q, (bs, hs) + q.shape[2:])
        k = jnp.broadcast_to(k, (bs, hs) + k.shape[2:])
        inner = jax.vmap(lambda b, h, q, k: tile_mask(self.predicate, self.buffers, b, h, q, k))  # over X
        inner = jax.vmap(jax.vmap(inner))  # over B', H'
        x = q.shape[2]
        ok = inner(jnp.broadcast_to(b, (bs, hs, x)), jnp.broadcast_to(h, (bs, hs, x)), q, k)
        in_range = (q[..., :, None] >= 0) & (q[..., :, None] < self.q_len)
        return ok & in_range & (k[..., None, :] >= 0) & (k[..., None, :] < self.kv_len)

    def to_dense(self) -> jax.Array:
        """bool[B', H', Nq, Nk] (O(Nq Nk) memory: tests and small problems)."""
        bs, hs = self.block_state.shape[:2]
        idx = lambda n: jnp.arange(n, dtype=jnp.int32)  # noqa: E731
        return _grid(self.predicate, self.buffers, idx(bs), idx(hs), idx(self.q_len), idx(self.kv_len))


def from_mask_fn(
    mask_fn: Callable,
    q_len: int,
    kv_len: int,
    *,
    batch: int | None = None,
    heads: int | None = None,
    block_size: int | tuple[int, int] | None = None,
    capacity: int | tuple[int, int] | None = None,
    exhaustive: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> MaskFnPattern:
    """The block-sparse pattern of `mask_fn(b, h, q_idx, kv_idx) -> bool` over queries [0, q_len), keys [0, kv_len).

    Args:
      mask_fn: any jnp-traceable predicate of int32 indices (`patterns.mask_fns` has ready-made ones and
        `and_masks` / `or_masks`); the arrays it closes over become the pattern's buffers.
      batch, heads: the batch and head counts the mask depends on (None: it does not, and a predicate that reads b
        or h is refused; 1: evaluated at b = 0 / h = 0 for every row or head).
      block_size: the block (both sides, or (block_q, block_k)); default min(128, length). A block larger than its
        length is refused; lengths need not be multiples of it.
      capacity: static widths of the (partial, full) key-block lists per query block (an int for both). Default:
        the exact maxima when the buffers are concrete; when they are traced (built under jit), every key block,
        which makes the executors as costly as dense: pass the widths your masks need there.
      exhaustive: classify by evaluating the predicate on every index pair (exact: a PARTIAL block has both allowed
        and excluded pairs) instead of by interval bounds.
      chunk_elements: predicate evaluations per exhaustive classification step (peak memory about twice this many
        bytes).

    Blocks are classified from interval bounds of the predicate over each block's index ranges
    (`patterns.mask_bounds`: O(B' H' Qb Kb) time and memory; a block it cannot decide is PARTIAL, which costs time,
    never correctness), or, for a predicate those rules do not cover or with `exhaustive`, by evaluating it on all
    B' H' Nq Nk index pairs chunk by chunk (time O(Nq Nk), memory O(chunk_elements + B' H' Qb Kb)).
    """
    q_len = common.static_int("q_len", q_len, low=1)
    kv_len = common.static_int("kv_len", kv_len, low=1)
    batch = common.static_int("batch", batch, low=1, none_ok=True)
    heads = common.static_int("heads", heads, low=1, none_ok=True)
    bq, bk = block_size if isinstance(block_size, tuple) else (block_size, block_size)
    bq = min(DEFAULT_BLOCK, q_len) if bq is None else common.static_int("block_size (queries)", bq, low=1, high=q_len,
                                                                         why=f" (q_len {q_len})")  # fmt: skip
    bk = min(DEFAULT_BLOCK, kv_len) if bk is None else common.static_int("block_size (keys)", bk, low=1, high=kv_len,
                                                                          why=f" (kv_len {kv_len})")  # fmt: skip
    chunk_elements = common.static_int("chunk_elements", chunk_elements, low=1)
    check = getattr(mask_fn, "check", None)
    if check is not None:  # the ready-made predicates check their arrays against the sizes
        check(batch, q_len, kv_len)
    predicate, buffers = trace_mask_fn(mask_fn)
    for reads, given, what in ((predicate.reads_batch, batch, "batch row b: pass batch=B (batch=1: b = 0 for every row)"),
                               (predicate.reads_heads, heads, "head h: pass heads=H (heads=1: h = 0 for every head)")):
        if reads and given is None:  # evaluating it at 0 for every row would be silently wrong
            raise ValueError(f"mask_fn ({predicate.name}) depends on the {what}")
    bs, hs = batch or 1, heads or 1
    sizes = (bs, hs, q_len, kv_len, bq, bk)
    state = None if exhaustive else _bounds(predicate, buffers, *sizes)
    if state is None:
        state = _exhaustive(predicate, buffers, *sizes, chunk_elements)
    partial, full = state == PARTIAL, state == FULL
    nkb = state.shape[-1]
    if capacity is None:
        if common.is_concrete(state):
            host = common.host(state)
            widths = (int(np.max(np.sum(host == PARTIAL, -1))), int(np.max(np.sum(host == FULL, -1))))
        else:
            widths = (nkb, nkb)
    else:
        widths = capacity if isinstance(capacity, tuple) else (capacity, capacity)
        widths = tuple(common.static_int("capacity", c, low=0, high=nkb, why=f" ({nkb} key blocks)") for c in widths)
    kv_count, kv_idx, _ = compact_flags(partial, widths[0])
    full_count, full_idx, _ = compact_flags(full, widths[1])
    return MaskFnPattern(predicate=predicate, buffers=buffers, block_state=state, kv_count=kv_count, kv_idx=kv_idx,
                         full_count=full_count, full_idx=full_idx, q_len=q_len, kv_len=kv_len, block_q=bq,
                         block_k=bk)  # fmt: skip


# Jitted (inlined under an outer jit): one compilation per predicate program and sizes, whatever the buffers hold.
_bounds = jax.jit(mask_bounds.block_states, static_argnums=(0, 2, 3, 4, 5, 6, 7))


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4, 5, 6, 7, 8))
def _exhaustive(predicate, buffers, bs: int, hs: int, q_len: int, kv_len: int, bq: int, bk: int, chunk: int):
    """int8[B', H', Qb, Kb] block states from every index pair, a chunk of query blocks at a time."""
    nqb, nkb = math.ceil(q_len / bq), math.ceil(kv_len / bk)
    k = jnp.arange(nkb * bk, dtype=jnp.int32)
    k_ok = (k < kv_len).reshape(nkb, bk)
    b, h = jnp.arange(bs, dtype=jnp.int32), jnp.arange(hs, dtype=jnp.int32)

    def one(qb):
        q = qb * bq + jnp.arange(bq, dtype=jnp.int32)
        q_ok = q < q_len
        m = _grid(predicate, buffers, b, h, jnp.minimum(q, q_len - 1), jnp.minimum(k, kv_len - 1))
        m = m.reshape(bs, hs, bq, nkb, bk)
        m = m & k_ok[None, None, None] & q_ok[None, None, :, None, None]
        hit = jnp.any(m, axis=(2, 4))
        every = jnp.all(m | ~q_ok[None, None, :, None, None], axis=(2, 4)) & jnp.all(k_ok, axis=-1)[None, None]
        return jnp.where(every & hit, FULL, jnp.where(hit, PARTIAL, EMPTY)).astype(jnp.int8)

    per_step = max(1, min(nqb, chunk // max(bs * hs * bq * nkb * bk, 1)))
    state = jax.lax.map(one, jnp.arange(nqb, dtype=jnp.int32), batch_size=per_step)  # [Qb, B', H', Kb]
    return jnp.moveaxis(state, 0, 2)
