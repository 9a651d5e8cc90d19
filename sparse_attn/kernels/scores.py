"""Score functions inside the kernels: `score_fn(score, b, h, q_idx, kv_idx)` evaluated on a tile's logits and index
iotas, its closed-over arrays ("buffers": ALiBi slopes, a bias table) passed to the kernel as whole-array refs.

A kernel cannot capture arrays, so the function is traced (`jax.make_jaxpr`) at the tile's shapes and run by a small
interpreter that turns reads of a buffer into ref reads: an element gather (`table[i, j]` with index tiles: a
Triton pointer gather) and a dynamic slice (`slopes[h]`: a scalar read, SMEM on TPU). Any other use of a buffer
reads it whole. Out-of-range indices are clamped, as jnp's gathers do. The Mosaic backend has no element gathers:
a score function that gathers from a buffer with index tiles is refused there when lowering, naming the read.

The backward multiplies dS by the elementwise derivative (`jax.jvp` of the same interpreter). Gradients into the
buffers are not computed in the kernels (scatter-adds into a table have no portable Pallas form): when the buffers
are differentiated the executor's backward is the XLA executor's autodiff (`executors.pallas`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True, eq=False)
class KernelScore:
    """A score function as the kernels run it (static; compared by identity). `buffers` are passed beside it."""

    fn: Callable
    q_len: int
    kv_len: int
    shapes: tuple[tuple[int, ...], ...]  # of the buffers, as the caller holds them
    gathers: bool  # whether the TPU kernels can take it (scalar reads only)

    @property
    def num_buffers(self) -> int:
        return len(self.shapes)


def prepare(score_fn: Callable, q_len: int, kv_len: int, tile: tuple[int, int]) -> tuple[KernelScore, tuple]:
    """(KernelScore, buffers): the buffers traced from `score_fn` on a float32 tile and its int32 index column/row;
    each buffer goes to the kernel at least 1-d (refs of rank 0 are not portable)."""
    closed = _trace(score_fn, tile, transposed=False)
    buffers = tuple(jnp.asarray(c) for c in closed.consts)
    gathers = any(e.primitive.name == "gather" for e in _all_eqns(closed.jaxpr))
    score = KernelScore(score_fn, q_len, kv_len, tuple(b.shape for b in buffers), gathers)
    return score, tuple(b.reshape(b.shape or (1,)) for b in buffers)


def _trace(score_fn, tile, *, transposed: bool):
    rows, cols = tile
    i32 = jnp.int32
    sds = jax.ShapeDtypeStruct
    q, k = (sds((1, rows), i32), sds((cols, 1), i32)) if transposed else (sds((rows, 1), i32), sds((1, cols), i32))
    shape = (cols, rows) if transposed else (rows, cols)
    return jax.make_jaxpr(score_fn)(sds(shape, jnp.float32), sds((), i32), sds((), i32), q, k)


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from _all_eqns(sub)


def apply(score: KernelScore, buffer_refs, s, b, h, q_pos, k_pos, *, transposed: bool, derivative: bool):
    """score_fn on the scaled float32 logits s of one tile ([bq, bk], or [bk, bq] keys down when `transposed`);
    q_pos/k_pos: int32 columns/rows of positions (clamped here into the lengths). With `derivative`, returns
    (scores, d scores / d s) (elementwise)."""
    q_pos = jnp.clip(q_pos, 0, score.q_len - 1)
    k_pos = jnp.clip(k_pos, 0, score.kv_len - 1)
    tile = (s.shape[1], s.shape[0]) if transposed else s.shape
    closed = _trace(score.fn, tile, transposed=transposed)
    if len(closed.consts) != score.num_buffers:
        raise ValueError(f"score_fn closes over {len(closed.consts)} arrays at tile shape {tile}, {score.num_buffers} "
                         f"at the first trace: it must read the same arrays for every shape")  # fmt: skip
    refs = [_Ref(r, shape) for r, shape in zip(buffer_refs, score.shapes, strict=True)]

    def run(s_):
        out = _eval(closed.jaxpr, refs, [s_, b, h, q_pos, k_pos])[0]
        return out.astype(jnp.float32)

    if not derivative:
        return run(s)
    return jax.jvp(run, (s,), (jnp.ones_like(s),))


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A buffer's ref and the shape the score function sees (the ref may hold it reshaped to 1-d)."""

    ref: object
    shape: tuple[int, ...]

    def load(self):
        return self.ref[...].reshape(self.shape)


@dataclasses.dataclass(frozen=True)
class _Scalar:
    """A size-1 dynamic slice of a buffer, read as a scalar (a squeeze keeps it one; other uses broadcast it)."""

    value: jax.Array
    shape: tuple[int, ...]

    def load(self):
        return jnp.broadcast_to(self.value, self.shape)


@dataclasses.dataclass(frozen=True)
class _Columns:
    """Index columns concatenated on a last axis of size 1 each (how jnp builds a gather's index array): kept apart
    so that the gather reads `x[i, j]` without slicing them out again (Triton lowers no `slice`)."""

    parts: tuple

    def load(self):
        return jnp.concatenate(self.parts, axis=-1)


_LAZY = (_Ref, _Scalar, _Columns)


def _eval(jaxpr, consts, args):
    env = {}

    def read(v):
        return v.val if isinstance(v, jex.Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts, strict=True):
        env[var] = val
    for var, val in zip(jaxpr.invars, args, strict=True):
        env[var] = val
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        special = any(isinstance(x, _LAZY) for x in ins)
        if eqn.primitive.name == "concatenate" and _columns(eqn):
            outs = [_Columns(tuple(ins))]
        elif special and eqn.primitive.name in ("jit", "pjit"):
            inner = eqn.params["jaxpr"]
            outs = _eval(inner.jaxpr, list(inner.consts), ins)
        elif special and eqn.primitive.name == "gather" and isinstance(ins[0], _Ref):
            outs = [_gather(ins[0], ins[1], eqn.params)]
        elif special and eqn.primitive.name == "dynamic_slice" and isinstance(ins[0], _Ref):
            outs = [_dynamic_slice(ins[0], ins[1:], eqn.params["slice_sizes"])]
        elif special and eqn.primitive.name in ("squeeze", "reshape") and isinstance(ins[0], _Scalar):
            out_shape = eqn.outvars[0].aval.shape
            outs = [ins[0].value if out_shape == () else jnp.broadcast_to(ins[0].value, out_shape)]
        else:
            ins = [x.load() if isinstance(x, _LAZY) else x for x in ins]
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = params if isinstance(params, tuple) else ((), params)  # (older JAX: with subfuns)
            outs = eqn.primitive.bind(*subfuns, *ins, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for var, val in zip(eqn.outvars, outs, strict=True):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


def _columns(eqn) -> bool:
    rank = len(eqn.outvars[0].aval.shape)
    return eqn.params["dimension"] == rank - 1 and all(v.aval.shape[-1] == 1 for v in eqn.invars)


def _gather(buf: _Ref, indices, params):
    """An element gather (`buf[i, j]` with index arrays): one ref read with clamped index arrays."""
    dn = params["dimension_numbers"]
    rank = len(buf.shape)
    every_axis = sorted(dn.start_index_map) == list(range(rank)) == sorted(dn.collapsed_slice_dims)
    element = every_axis and not dn.offset_dims and not dn.operand_batching_dims and set(params["slice_sizes"]) <= {1}
    if not element:
        raise NotImplementedError(f"score_fn reads a closed-over array of shape {buf.shape} with a gather the "
                                  f"kernels do not take (only element reads x[i], x[i, j]): use implementation='xla'")
    if isinstance(indices, _Columns):
        cols = [jax.lax.squeeze(c, (c.ndim - 1,)) for c in indices.parts]
    else:
        cols = [jax.lax.squeeze(c, (c.ndim - 1,)) for c in jnp.split(indices, indices.shape[-1], axis=-1)]
    per_dim = [None] * rank
    for col, d in enumerate(dn.start_index_map):
        per_dim[d] = jnp.clip(cols[col].astype(jnp.int32), 0, buf.shape[d] - 1)
    return buf.ref[tuple(per_dim)]


def _dynamic_slice(buf: _Ref, starts, sizes):
    starts = [jnp.clip(s.astype(jnp.int32), 0, n - z) for s, n, z in zip(starts, buf.shape, sizes, strict=True)]
    if len(buf.shape) != len(buf.ref.shape):
        return buf.load()
    if all(z == 1 for z in sizes):
        return _Scalar(buf.ref[tuple(starts)], tuple(sizes))
    return buf.ref[tuple(pl.ds(s, z) for s, z in zip(starts, sizes, strict=True))]


def on_buffers(score: KernelScore, buffers) -> Callable:
    """The score function with its closed-over arrays replaced by `buffers` (as `prepare` returned them): what the
    XLA backward differentiates to give the buffers their gradients. Traced at each call's shapes."""

    def score_fn(s, b, h, q_idx, kv_idx):
        closed = jax.make_jaxpr(score.fn)(s, b, h, q_idx, kv_idx)
        if len(closed.consts) != score.num_buffers:
            raise ValueError(f"score_fn closes over {len(closed.consts)} arrays here, {score.num_buffers} at the "
                             f"first trace: it must read the same arrays for every shape")  # fmt: skip
        bufs = [x.reshape(shape) for x, shape in zip(buffers, score.shapes, strict=True)]
        return jex.jaxpr_as_fun(jex.ClosedJaxpr(closed.jaxpr, bufs))(s, b, h, q_idx, kv_idx)[0]

    return score_fn
