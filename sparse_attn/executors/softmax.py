"""Masked softmax with the library's semantics: empty rows give 0 and lse -inf, masked keys get zero gradient.

Non-finite inputs (docs/architecture.md, "Non-finite values"): executors multiply only *sanitised* q, k, v (NaN and
infinities replaced by 0, `sanitize`) so that a pair the pattern excludes can never form 0 * NaN in a matmul or
its transpose, and add a per-token `poison` term (0, or NaN for a token with a non-finite entry) to the logits, so
that the rows that may attend such a token - and only they - still turn NaN. The mechanism executors (ABCA's
packed slots and anchor gather, the label executors) instead run on `finite` values and set the rows that read a
non-finite entry to NaN afterwards (`nonfinite_rows`, `range_any`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sanitize(x: jax.Array, *others: jax.Array) -> tuple[jax.Array, ...]:
    """(clean x, *clean others, poison): non-finite entries replaced by 0, and float32 poison [...] (x without its
    last axis): 0 where every entry of x (and of the others) at that position is finite, NaN elsewhere.

    `poison` carries no gradient; the clean arrays pass gradients through their finite entries only.
    """
    cleans, ok = [], None
    for y in (x,) + others:
        fin = jnp.isfinite(y)
        cleans.append(jnp.where(fin, y, jnp.zeros((), y.dtype)))
        row = jnp.all(fin, axis=-1)
        ok = row if ok is None else ok & row
    return (*cleans, jnp.where(ok, 0.0, jnp.nan).astype(jnp.float32))


def finite(x):
    """x with its non-finite entries selected to 0."""
    return jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))


def nonfinite_rows(x_BxNxHxD):
    """bool[B, N, H]: rows that hold a non-finite entry."""
    return ~jnp.all(jnp.isfinite(x_BxNxHxD), axis=-1)


def finite_rows(x_BxNxHxD):
    """(finite(x), nonfinite_rows(x))."""
    return finite(x_BxNxHxD), nonfinite_rows(x_BxNxHxD)


def range_any(flag_BxNxG, lo_BxN, hi_BxN):
    """bool[B, N, G]: does flag hold anywhere in [lo, hi] (per row; empty ranges give False)? O(N) prefix counts."""
    n = flag_BxNxG.shape[1]
    c = jnp.pad(jnp.cumsum(flag_BxNxG, axis=1, dtype=jnp.int32), ((0, 0), (1, 0), (0, 0)))

    def at(i):
        return jnp.take_along_axis(c, jnp.clip(i, 0, n)[..., None], axis=1)

    return (lo_BxN <= hi_BxN)[..., None] & (at(hi_BxN + 1) > at(lo_BxN))


def apply_score_fn(score_fn, s_f32: jax.Array, b, h, q_idx, kv_idx, q_len: int, kv_len: int) -> jax.Array:
    """`score_fn(score, b, h, q_idx, kv_idx)` on the scaled float32 logits (None: s unchanged). The int32 index
    arrays broadcast against s; positions outside [0, len) (block padding) are clamped into it, so the function's
    gathers stay in range (those pairs are masked afterwards: a score function never turns a masked key back on).
    ValueError if the result does not keep s's shape."""
    if score_fn is None:
        return s_f32
    q_idx = jnp.clip(q_idx, 0, q_len - 1).astype(jnp.int32)
    kv_idx = jnp.clip(kv_idx, 0, kv_len - 1).astype(jnp.int32)
    out = jnp.asarray(score_fn(s_f32, jnp.asarray(b, jnp.int32), jnp.asarray(h, jnp.int32), q_idx, kv_idx))
    if out.shape != s_f32.shape or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"score_fn must return float scores of the logits' shape {s_f32.shape}, got "
                         f"{out.dtype}{out.shape}")  # fmt: skip
    return out.astype(jnp.float32)


def masked_softmax_parts(s_f32: jax.Array, allowed: jax.Array, axis: int = -1):
    """(e, denom, lse): unnormalised weights, the row sums to divide by (1 on empty rows), and log-sum-exp.

    Callers contract `e` with V first and divide the small result by `denom`, so the normalised [.., Q, K]
    probabilities are never materialised (one fewer score-sized buffer in forward and backward).
    A masked logit becomes -inf before `exp` (a select: any value there, NaN included, is dropped): its weight
    and its gradient are exactly 0. The row maximum is replaced by 0 on empty rows so that no `-inf - -inf` NaN can
    appear. A NaN among a row's allowed logits makes its lse NaN (its denominator stays 1, so the NaN reaches
    only the output of that row, never a masked pair's gradient).
    """
    s = jnp.where(allowed, s_f32, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    row_sum = jnp.sum(e, axis=axis, keepdims=True)
    alive = row_sum > 0
    denom = jnp.where(alive, row_sum, 1.0)
    dead = jnp.where(jnp.isnan(row_sum), jnp.nan, -jnp.inf)
    lse = jnp.where(alive, m + jnp.log(denom), dead)
    return e, denom, jnp.squeeze(lse, axis)


def masked_softmax(s_f32: jax.Array, allowed: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """(p, lse): p sums to 1 on rows with an allowed key and is 0 elsewhere; lse is -inf there."""
    e, denom, lse = masked_softmax_parts(s_f32, allowed, axis)
    return e / denom, lse


def zero_empty_rows(out: jax.Array, lse: jax.Array) -> jax.Array:
    """out (0 already) on rows with lse -inf, through a select: their cotangent, whatever it is, is dropped."""
    return jnp.where(jnp.isneginf(lse)[..., None], jnp.zeros((), out.dtype), out)


def merge_lse(out_xSxD: jax.Array, lse_xS: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Merges S partial softmax results along `axis` (of out's leading axes); all -inf rows give (0, -inf)."""
    m = jax.lax.stop_gradient(jnp.max(lse_xS, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse_xS - m)
    tot = jnp.sum(w, axis=axis, keepdims=True)
    alive = tot > 0
    w_xS1 = jnp.expand_dims(w / jnp.where(alive, tot, 1.0), -1)

    def take(x, s):
        return jnp.take(x, s, axis=axis)

    # S is small and static: a sum of slices, not a reduce. jaxlib 0.10.2's CPU backend segfaults running the
    # reduce over S for some shapes (o [2, 1, 64, S=2, 2, 2, 8], axis 3: the bucket and landmark parts of a
    # k = 1 batch of 2 under the executor's vmaps).
    out = sum(take(out_xSxD, s) * take(w_xS1, s) for s in range(out_xSxD.shape[axis]))
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, tot, 1.0)), -jnp.inf)
    return out, jnp.squeeze(lse, axis)
