"""Per-tile math shared by the Triton and Mosaic kernels (plain jnp on loaded tiles; no refs, no platform calls).

The forward keeps raw logits s = q.k and its running max m in the same units and exponentiates
`exp2((s - m) * c)` with c = scale * log2(e) (> 0; the wrapper folds a sign into q): s is one materialised value,
so at the row maximum the exponent is exactly 0 whatever the compiler fuses (scaling first, `exp2(s*c - m)` can
become `fma(s, c, -m)` and turn into exp2(+-hundreds) for logits ~1e10). The log-sum-exp leaves the kernels in
natural log; the backward recomputes p = exp2(s*c - lse2). Masked logits are -inf and never produce NaN: the
running max of a row that has seen no key is replaced by 0 before it is subtracted.

Non-finite values in masked tiles (docs/architecture.md): excluded pairs are removed by selects, never by a
multiply with 0, and the operands of the matmuls whose excluded products could be 0 * NaN are sanitised per tile
(O(tile x D) elementwise beside O(tile x tile x D) matmuls): `poison_keys` (forward: V, with its non-finiteness
moved onto K's logit so that only the rows that attend the key turn NaN) and `finite_or_zero` (dQ: K, dK: Q).
Full tiles contain allowed pairs only and are untouched.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.kernels.metadata import GLOBAL, VALID

LOG2E = math.log2(math.e)
NT = (((1,), (1,)), ((), ()))  # a @ b.T
NN = (((1,), (0,)), ((), ()))


def dot(a, b, dims=NN):
    # float32 operands ask for full precision: Triton would otherwise use TF32 (~1e-3 relative error).
    full = a.dtype == jnp.float32 and b.dtype == jnp.float32
    precision = jax.lax.Precision.HIGHEST if full else None
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def tile_mask(q0, k0, shape, lo, hi, q_tok, k_tok, q_labels, k_labels, rand, *, causal: bool, transposed: bool,
              exclude: bool = False):
    """bool tile of the kernel's element rule.

    Query-side arrays (lo, hi, q_tok, q_labels[w]) and key-side arrays (k_tok, k_labels[w]) come as columns/rows that
    broadcast to `shape`: [bq, bk] (queries down) or, with `transposed`, [bk, bq] (keys down, for dK/dV).
    `rand` is a scalar flag (a whole random tile) or None. `exclude`: the label lists hold 2W words, the second W of
    a query being the labels it excludes (`TokenMeta.exclude`); a key's second W words are unused.
    """
    qa, ka = (1, 0) if transposed else (0, 1)
    q_pos = q0 + jax.lax.broadcasted_iota(jnp.int32, shape, qa)
    k_pos = k0 + jax.lax.broadcasted_iota(jnp.int32, shape, ka)
    ok = ((lo <= k_pos) & (k_pos <= hi)) | ((k_tok & GLOBAL) != 0)
    if rand is not None:
        ok = ok | (rand != 0)
    ok = ok & ((q_tok & VALID) != 0) & ((k_tok & VALID) != 0)
    if causal:
        ok = ok & (k_pos <= q_pos)
    if q_labels:
        w = len(q_labels) // 2 if exclude else len(q_labels)
        share = (q_labels[0] & k_labels[0]) != 0
        for lq, lk in zip(q_labels[1:w], k_labels[1:w], strict=True):
            share = share | ((lq & lk) != 0)
        ok = ok & share
        if exclude:
            for lq, lk in zip(q_labels[w:], k_labels[:w], strict=True):
                ok = ok & ((lq & lk) == 0)
    return ok


def stored_mask(tile, *, transposed: bool):
    """bool tile from a loaded int8 [bq, bk] element mask (`element_masks.ElementMasks`), keys down when `transposed`
    (transposed as 32-bit: the narrowest transpose every backend lowers)."""
    if transposed:
        tile = tile.astype(jnp.int32).T
    return tile != 0


def online_update(m, row_sum, acc, s, v, *, c: float, masked: bool):
    """One step of the online softmax on raw logits s [bq, bk] (weights exp2((s - m) * c)); m (raw units), row_sum:
    [bq, 1], acc: [bq, D] float32."""
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    # A row that has seen no allowed key keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked else m_new
    alpha = jnp.exp2((m - m_use) * c)
    p = jnp.exp2((s - m_use) * c)
    row_sum = alpha * row_sum + jnp.sum(p, axis=1, keepdims=True)
    acc = alpha * acc + dot(p.astype(v.dtype), v)
    return m_new, row_sum, acc


def finalize(m, row_sum, acc, c: float):
    """(out [bq, D] float32, lse [bq, 1] natural log): 0 and -inf on rows with no allowed key."""
    empty = row_sum == 0.0
    out = acc / jnp.where(empty, 1.0, row_sum)
    lse = jnp.where(empty, -jnp.inf, (m * c + jnp.log2(jnp.where(empty, 1.0, row_sum))) / LOG2E)
    return out, lse


def lse2(lse):
    """Base-2 lse for recomputing p = exp2(s2 - lse2); +inf on empty rows so that p is 0 there (never NaN)."""
    return jnp.where(lse == -jnp.inf, jnp.inf, lse * LOG2E)


def masked_logits(s, ok):
    return s if ok is None else jnp.where(ok, s, -jnp.inf)


def select(ok, x):
    """x where the pair is allowed, exactly 0 elsewhere (whatever x holds there: NaN from excluded inputs, or from a
    poisoned row's lse/delta); ok None (full tile) keeps x."""
    return x if ok is None else jnp.where(ok, x, 0.0)


def _nonfinite(x):
    """float32 0 where x is finite, NaN where it is not (x * 0), elementwise."""
    return x.astype(jnp.float32) * 0.0


def finite_or_zero(x):
    """x with non-finite entries replaced by 0: the operand of a matmul whose excluded products must stay 0."""
    return jnp.where(_nonfinite(x) == 0.0, x, jnp.zeros((), x.dtype))


def poison_keys(k, v):
    """(k', v') for a masked forward tile [bk, D]: a key whose value row has a non-finite entry gets a NaN key row
    (its logit turns NaN for every query, and the mask keeps it only for the rows that attend it) and a zero value
    row (so p = 0 times it stays 0 for the rows that do not)."""
    z = jnp.sum(_nonfinite(v), axis=1, keepdims=True)  # [bk, 1]: 0, or NaN
    return k + z.astype(k.dtype), jnp.where(z == 0.0, v, jnp.zeros((), v.dtype))
