"""Block classification of a mask function by interval arithmetic: the predicate's program run once per block on
index *ranges* instead of indices, O(Qb Kb) work instead of O(Nq Nk).

Every value of the program becomes bounds over the block: integers an interval [lo, hi] (with a `wide` flag where
the bounds could leave int32's safe range, which then decides nothing), booleans a pair (can be true, can be false).
A block where the predicate cannot be false is FULL, one where it cannot be true EMPTY, the rest PARTIAL (the
executors apply the predicate element-wise there, so a PARTIAL that is in fact empty or full costs time, never
correctness). Reads of a closed-over array at an index range (`seg[b, q_idx]`) take the array's min and max over the
range from a sparse table. The rules cover integer and boolean arithmetic, comparisons, logic, selects, integer
division and remainder, and nested calls; a program using anything else (floats, bit shifts, gathers by computed
arrays) makes `block_states` return None, and `from_mask_fn` evaluates the predicate exhaustively instead.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.extend.core as jex
import jax.numpy as jnp

SAFE = float(2**30)  # integer bounds beyond this may wrap in int32 arithmetic: such a value decides nothing


class Unsupported(Exception):
    """The program uses an operation the interval rules do not cover."""


@dataclasses.dataclass
class Ints:
    lo: jax.Array
    hi: jax.Array
    wide: jax.Array  # bool: bounds unreliable (could have wrapped)
    point: bool  # static: lo == hi everywhere (b, h, literals and what is computed from them alone)


@dataclasses.dataclass
class Bools:
    can_true: jax.Array
    can_false: jax.Array
    point: bool = False  # static: computed from points alone (exactly one of the two holds)


@dataclasses.dataclass
class Array:
    value: jax.Array  # a closed-over array, readable only by dynamic_slice


def _ints(lo, hi, wide=None, point=False) -> Ints:
    lo, hi = jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)
    return Ints(lo, hi, jnp.zeros((), bool) if wide is None else wide, point)


def _checked(lo_f, hi_f, lo, hi, wide, point) -> Ints:
    """Integer bounds with their float32 estimates: beyond SAFE the int32 values may have wrapped."""
    wide = wide | (jnp.maximum(jnp.abs(lo_f), jnp.abs(hi_f)) >= SAFE)
    return Ints(jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32), wide, point)


def _f(x):
    return x.astype(jnp.float32)


def _corners(fn, a: Ints, b: Ints) -> Ints:
    combos = [fn(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    combos_f = [fn(_f(x), _f(y)) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    lo, hi = combos[0], combos[0]
    lo_f, hi_f = combos_f[0], combos_f[0]
    for c, cf in zip(combos[1:], combos_f[1:], strict=True):
        lo, hi, lo_f, hi_f = jnp.minimum(lo, c), jnp.maximum(hi, c), jnp.minimum(lo_f, cf), jnp.maximum(hi_f, cf)
    return _checked(lo_f, hi_f, lo, hi, a.wide | b.wide, a.point and b.point)


def _compare(name: str, a: Ints, b: Ints) -> Bools:
    wide = a.wide | b.wide
    if name == "lt":
        t, f = a.lo < b.hi, a.hi >= b.lo
    elif name == "le":
        t, f = a.lo <= b.hi, a.hi > b.lo
    elif name == "gt":
        t, f = a.hi > b.lo, a.lo <= b.hi
    elif name == "ge":
        t, f = a.hi >= b.lo, a.lo < b.hi
    else:
        overlap = (a.lo <= b.hi) & (b.lo <= a.hi)
        same = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
        t, f = (overlap, ~same) if name == "eq" else (~same, overlap)
    return Bools(t | wide, f | wide, a.point and b.point)


def _select(which: Bools | Ints, cases):
    """select_n: case i where the selector is i (a bool selects case 1 when true): the hull of the cases it may
    select."""
    if not (all(isinstance(c, Bools) for c in cases) or all(isinstance(c, Ints) for c in cases)):
        raise Unsupported("select_n over mixed values")
    if isinstance(which, Bools):
        if len(cases) != 2:
            raise Unsupported("select_n with a bool selector over more than two cases")
        masks = [which.can_false, which.can_true]
    else:
        masks = [(which.lo <= i) & (i <= which.hi) | which.wide for i in range(len(cases))]
    if isinstance(cases[0], Bools):
        t = jnp.zeros((), bool)
        f = jnp.zeros((), bool)
        for m, c in zip(masks, cases, strict=True):
            t, f = t | (m & c.can_true), f | (m & c.can_false)
        return Bools(t, f, which.point and all(c.point for c in cases))
    big = jnp.int32(2**31 - 1)
    lo, hi, wide = big, -big, jnp.zeros((), bool)
    for m, c in zip(masks, cases, strict=True):
        lo = jnp.minimum(lo, jnp.where(m, c.lo, big))
        hi = jnp.maximum(hi, jnp.where(m, c.hi, -big))
        wide = wide | (m & c.wide)
    return Ints(lo, hi, wide, all(c.point for c in cases) and which.point)


def _range_bounds(row, lo, hi):
    """(min, max) of row[lo..hi] (inclusive, clamped into the row) for arrays of ranges: a sparse table."""
    n = row.shape[0]
    lo, hi = jnp.clip(lo, 0, n - 1), jnp.clip(hi, 0, n - 1)
    levels_min, levels_max = [row], [row]
    span = 1
    while 2 * span <= n:
        prev_min, prev_max = levels_min[-1], levels_max[-1]
        levels_min.append(jnp.minimum(prev_min[: n - 2 * span + 1], prev_min[span : n - span + 1]))
        levels_max.append(jnp.maximum(prev_max[: n - 2 * span + 1], prev_max[span : n - span + 1]))
        span *= 2
    length = hi - lo + 1
    level = jnp.floor(jnp.log2(length.astype(jnp.float32))).astype(jnp.int32)
    level = jnp.clip(level, 0, len(levels_min) - 1)
    out_min = jnp.full(lo.shape, jnp.iinfo(jnp.int32).max, row.dtype)
    out_max = jnp.full(lo.shape, jnp.iinfo(jnp.int32).min, row.dtype)
    for j, (tmin, tmax) in enumerate(zip(levels_min, levels_max, strict=True)):
        right = jnp.clip(hi - 2**j + 1, 0, tmin.shape[0] - 1)
        left = jnp.clip(lo, 0, tmin.shape[0] - 1)
        at = level == j
        out_min = jnp.where(at, jnp.minimum(tmin[left], tmin[right]), out_min)
        out_max = jnp.where(at, jnp.maximum(tmax[left], tmax[right]), out_max)
    return out_min, out_max


def _dynamic_slice(operand: Array, indices: list[Ints], sizes) -> Ints:
    x = operand.value
    if any(s != 1 for s in sizes) or not _exact_int(x.dtype):
        raise Unsupported("dynamic_slice other than one element of an int32-representable array")
    ranged = [i for i, ix in enumerate(indices) if not ix.point]
    if len(ranged) > 1:
        raise Unsupported("an array read at more than one index range")
    wide = jnp.zeros((), bool)
    for ix in indices:
        wide = wide | ix.wide
    # Points: take them (clamped, as dynamic_slice does); the ranged axis stays.
    row = x
    axis = ranged[0] if ranged else None
    for i in reversed(range(x.ndim)):
        if i == axis:
            continue
        point = jnp.clip(indices[i].lo, 0, x.shape[i] - 1)
        if point.ndim:
            raise Unsupported("an index that should be a point varies over the blocks")
        row = jnp.take(row, point, axis=i)
    if axis is None:
        v = row.astype(jnp.int32)
        return Ints(v, v, wide, True)
    ix = indices[axis]  # a wide index may read anywhere: the whole axis
    lo = jnp.where(ix.wide, 0, ix.lo)
    hi = jnp.where(ix.wide, row.shape[0] - 1, ix.hi)
    vmin, vmax = _range_bounds(row.astype(jnp.int32), lo, hi)
    return Ints(vmin, vmax, jnp.zeros((), bool), False)


def _literal(value):
    v = jnp.asarray(value)
    if v.ndim:
        return Array(v)
    if v.dtype == jnp.bool_:
        return Bools(v, ~v, True)
    if not _exact_int(v.dtype):
        raise Unsupported(f"a {v.dtype} constant")
    return Ints(v.astype(jnp.int32), v.astype(jnp.int32), jnp.zeros((), bool), True)


def _eval(jaxpr, consts, args):
    env = {}

    def read(v):
        return _literal(v.val) if isinstance(v, jex.Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts, strict=True):
        env[var] = _literal(val) if not isinstance(val, (Ints, Bools, Array)) else val
    for var, val in zip(jaxpr.invars, args, strict=True):
        env[var] = val
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        outs = _rule(eqn, ins)
        for var, val in zip(eqn.outvars, outs, strict=True):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


# Integer dtypes whose values int32 intervals hold exactly (unsigned 32-bit arithmetic wraps at 2^32, not 2^31).
_EXACT_INTS = (jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint16)


def _exact_int(dtype) -> bool:
    return any(dtype == t for t in _EXACT_INTS)


def _rule(eqn, ins):
    name = eqn.primitive.name
    params = eqn.params
    for v in eqn.outvars:
        dt = v.aval.dtype
        if not (dt == jnp.bool_ or _exact_int(dt)):
            raise Unsupported(f"{name} produces {dt}")
    if name in ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call"):
        inner = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
        if inner is None:
            raise Unsupported(name)
        closed = inner if hasattr(inner, "consts") else jex.ClosedJaxpr(inner, [])
        return _eval(closed.jaxpr, closed.consts, ins)
    if name in ("squeeze", "reshape", "broadcast_in_dim", "copy", "copy_p", "convert_element_type"):
        x = ins[0]
        if isinstance(x, Array):
            raise Unsupported(f"{name} of an array")
        if name == "convert_element_type" and isinstance(x, Bools) != (params["new_dtype"] == jnp.bool_):
            if isinstance(x, Bools):  # bool -> int: 0 or 1
                return [Ints(jnp.where(x.can_false, 0, 1), jnp.where(x.can_true, 1, 0), jnp.zeros((), bool), x.point)]
            raise Unsupported("int -> bool conversion")
        if name == "convert_element_type" and isinstance(x, Ints) and params["new_dtype"] != jnp.int32:
            info = jnp.iinfo(params["new_dtype"])  # narrowing wraps values outside the target's range
            outside = (x.lo < info.min) | (x.hi > info.max)
            return [Ints(x.lo, x.hi, x.wide | outside, x.point)]
        return [x]
    if name == "dynamic_slice":
        if not isinstance(ins[0], Array):
            raise Unsupported("dynamic_slice of a computed value")
        return [_dynamic_slice(ins[0], ins[1:], params["slice_sizes"])]
    if any(isinstance(x, Array) for x in ins):
        raise Unsupported(f"{name} of a whole array")
    if name == "select_n":
        return [_select(ins[0], ins[1:])]
    if all(isinstance(x, Bools) for x in ins):
        point = all(x.point for x in ins)
        if name == "and":
            a, b = ins
            return [Bools(a.can_true & b.can_true, a.can_false | b.can_false, point)]
        if name == "or":
            a, b = ins
            return [Bools(a.can_true | b.can_true, a.can_false & b.can_false, point)]
        if name == "not":
            return [Bools(ins[0].can_false, ins[0].can_true, point)]
        if name == "xor":
            a, b = ins
            return [Bools((a.can_true & b.can_false) | (a.can_false & b.can_true),
                          (a.can_true & b.can_true) | (a.can_false & b.can_false), point)]  # fmt: skip
        if name in ("eq", "ne"):
            a, b = ins
            eq = Bools((a.can_true & b.can_true) | (a.can_false & b.can_false),
                       (a.can_true & b.can_false) | (a.can_false & b.can_true), point)  # fmt: skip
            return [eq if name == "eq" else Bools(eq.can_false, eq.can_true, point)]
        raise Unsupported(f"{name} of booleans")
    if not all(isinstance(x, Ints) for x in ins):
        raise Unsupported(f"{name} of mixed values")
    if name in ("lt", "le", "gt", "ge", "eq", "ne"):
        return [_compare(name, *ins)]
    if name == "add":
        a, b = ins
        return [_checked(_f(a.lo) + _f(b.lo), _f(a.hi) + _f(b.hi), a.lo + b.lo, a.hi + b.hi, a.wide | b.wide,
                         a.point and b.point)]  # fmt: skip
    if name == "sub":
        a, b = ins
        return [_checked(_f(a.lo) - _f(b.hi), _f(a.hi) - _f(b.lo), a.lo - b.hi, a.hi - b.lo, a.wide | b.wide,
                         a.point and b.point)]  # fmt: skip
    if name == "neg":
        a = ins[0]
        return [Ints(-a.hi, -a.lo, a.wide | (a.lo <= -(2**31) + 1), a.point)]
    if name == "mul":
        return [_corners(jnp.multiply, *ins)]
    if name in ("max", "min"):
        a, b = ins
        op = jnp.maximum if name == "max" else jnp.minimum
        return [Ints(op(a.lo, b.lo), op(a.hi, b.hi), a.wide | b.wide, a.point and b.point)]
    if name == "abs":
        a = ins[0]
        lo = jnp.where(a.lo >= 0, a.lo, jnp.where(a.hi <= 0, -a.hi, 0))
        return [Ints(lo, jnp.maximum(jnp.abs(a.lo), jnp.abs(a.hi)), a.wide, a.point)]
    if name == "sign":
        a = ins[0]
        return [Ints(jnp.sign(a.lo), jnp.sign(a.hi), a.wide, a.point)]
    if name == "div":  # truncating integer division: monotone in each argument where the divisor keeps its sign
        a, b = ins
        zero = (b.lo <= 0) & (b.hi >= 0)
        out = _corners(lambda x, y: jax.lax.div(x, jnp.where(y == 0, 1, y)), a, b)
        return [Ints(out.lo, out.hi, out.wide | zero, out.point)]
    if name == "rem":  # the sign of the dividend, magnitude below the divisor's
        a, b = ins
        m = jnp.maximum(jnp.abs(b.lo), jnp.abs(b.hi)) - 1
        lo = jnp.where(a.lo >= 0, 0, -m)
        hi = jnp.where(a.hi <= 0, 0, m)
        inside = (a.lo >= 0) & (a.hi < jnp.minimum(jnp.abs(b.lo), jnp.abs(b.hi))) & (b.lo == b.hi)
        lo, hi = jnp.where(inside, a.lo, lo), jnp.where(inside, a.hi, hi)
        zero = (b.lo <= 0) & (b.hi >= 0)
        return [Ints(lo, hi, a.wide | b.wide | zero, a.point and b.point)]
    raise Unsupported(name)


def block_states(predicate, buffers, bs: int, hs: int, q_len: int, kv_len: int, bq: int, bk: int):
    """int8[B', H', Qb, Kb] block states (0 empty, 1 partial, 2 full) from interval bounds, or None when the
    predicate uses an operation the rules do not cover."""
    nqb, nkb = math.ceil(q_len / bq), math.ceil(kv_len / bk)
    q0 = jnp.arange(nqb, dtype=jnp.int32)[:, None] * bq
    k0 = jnp.arange(nkb, dtype=jnp.int32)[None, :] * bk
    q_iv = Ints(q0, jnp.minimum(q0 + bq - 1, q_len - 1), jnp.zeros((), bool), False)
    k_iv = Ints(k0, jnp.minimum(k0 + bk - 1, kv_len - 1), jnp.zeros((), bool), False)
    whole_keys = (k0 + bk <= kv_len) & jnp.ones((nqb, 1), bool)  # a block with padding keys is never full

    def one(b, h):
        out = _eval(predicate.jaxpr, list(buffers),
                    [Ints(b, b, jnp.zeros((), bool), True), Ints(h, h, jnp.zeros((), bool), True), q_iv, k_iv])[0]
        if not isinstance(out, Bools):
            raise Unsupported("the predicate's result")
        t = jnp.broadcast_to(out.can_true, (nqb, nkb))
        f = jnp.broadcast_to(out.can_false, (nqb, nkb))
        return jnp.where(t & ~f & whole_keys, 2, jnp.where(t, 1, 0)).astype(jnp.int8)

    b = jnp.arange(bs, dtype=jnp.int32)
    h = jnp.arange(hs, dtype=jnp.int32)
    try:
        return jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None))(b, h)
    except Unsupported:
        return None
