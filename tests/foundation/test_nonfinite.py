"""Non-finite values at positions a row may not attend never reach that row, nor any gradient through an excluded pair.

Every pattern type (Intervals with global tokens and label bits, BlockLayout, NeighbourList) and executor
("reference", "xla", "pallas" in interpret mode, Triton and Mosaic kernels) against its own clean run.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from sparse_attn import patterns as P
from sparse_attn.kernels import BlockSizes, KernelConfig

B, N, H, G, D = 2, 32, 4, 2, 16
VL = 21  # batch 1 is padded from here on
TILE = 8
IMPLS = {
    "reference": {},
    "xla": dict(block=TILE),
    "triton": dict(config=KernelConfig(backend="triton", interpret=True, block_sizes=BlockSizes(block_q=8, block_k=8))),
    "mosaic": dict(config=KernelConfig(backend="mosaic", interpret=True, block_sizes=BlockSizes(block_q=8, block_k=8))),
}


def _labels():
    rng = np.random.default_rng(3)
    bits = rng.integers(1, 16, size=(1, H, N, 1)).astype(np.uint32)  # 4 labels, every token holds at least one
    return jnp.asarray(bits)


def intervals():
    """A causal-free window of radius 5 with two global tokens (positions 3 and 17) and per-head label bits."""
    i = np.arange(N)
    lo = jnp.asarray(np.maximum(i - 5, 0), jnp.int32).reshape(1, 1, N)
    hi = jnp.asarray(np.minimum(i + 5, N - 1), jnp.int32).reshape(1, 1, N)
    vl = jnp.array([N, VL])
    glob = jnp.zeros((1, N), bool).at[:, jnp.array([3, 17])].set(True) & (jnp.arange(N)[None] < vl[:, None])
    return P.Intervals(lo, hi, valid_len=vl, global_tokens=glob, label_bits=_labels(), reach=(5, 5), max_global=2)


def layout():
    """BigBird (window, a global token, random 8-token blocks) over a padded batch."""
    return P.bigbird(N, 3, 1, 1, TILE, jax.random.PRNGKey(1), valid_len=jnp.array([N, VL]), batch=B)


def neighbours():
    """Three slots per row; batch 1 past VL has no valid slot and no valid slot points there, but invalid slots
    point everywhere (an excluded gather)."""
    rng = np.random.default_rng(0)
    idx = np.stack([np.tile(np.arange(N), (B, 1)), rng.integers(0, N, (B, N)), rng.integers(0, N, (B, N))], -1)
    valid = np.ones_like(idx, bool)
    valid[:, :, 1] &= idx[:, :, 1] != idx[:, :, 0]
    valid[:, :, 2] &= (idx[:, :, 2] != idx[:, :, 0]) & (idx[:, :, 2] != idx[:, :, 1])
    valid[1] &= idx[1] < VL
    valid[1, VL:] = False
    valid[:, 5, 1:] = False
    idx[0, 5, 1:] = (10, 25)  # excluded gathers of the keys the in-tile test poisons
    bias = rng.normal(size=idx.shape).astype(np.float32)
    return P.NeighbourList(*(jnp.asarray(x)[:, None] for x in (idx.astype(np.int32), valid, bias)))


PATTERNS = {"intervals": intervals, "layout": layout, "neighbours": neighbours}
# NeighbourList patterns have no "pallas" executor (no kernel for K <= 3 rows).
CASES = [(p, i) for p in PATTERNS for i in ("reference", "xla", "triton") if (p, i) != ("neighbours", "triton")]
CASES += [("intervals", "mosaic")]


def _inputs(seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (B, N, H, D))
    k = jax.random.normal(ks[1], (B, N, G, D))
    v = jax.random.normal(ks[2], (B, N, G, D))
    ct = jax.random.normal(ks[3], (B, N, H, D))
    return q, k, v, ct


@functools.partial(jax.jit, static_argnames=("impl",))
def _run(q, k, v, ct, pattern, impl):
    """(out, lse, dq, dk, dv) for loss = <out, ct> + sum of the finite lse."""
    opts = IMPLS[impl]
    name = "pallas" if impl in ("triton", "mosaic") else impl

    def loss(q, k, v):
        out, lse = sa.attention(q, k, v, pattern, implementation=name, return_lse=True, **opts)
        return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

    (_, (out, lse)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return (out, lse) + grads


def _allowed(pattern):
    """bool[B, H, N, N]."""
    return np.broadcast_to(np.asarray(pattern.to_dense()), (B, H, N, N))


def _plant(x, where_BxN, values):
    """x with entries at the marked positions replaced, cycling through `values` (NaN, +inf, -inf ...)."""
    x = np.array(x)
    b, n = np.nonzero(where_BxN)
    for t, (bi, ni) in enumerate(zip(b, n, strict=True)):
        x[bi, ni, t % x.shape[2], t % x.shape[3]] = values[t % len(values)]
    return jnp.asarray(x)


@pytest.mark.parametrize("name,impl", CASES)
def test_padding_never_reaches_valid_rows_and_gets_zero_gradient(name, impl):
    """NaN and +-inf in q, k, v at padded positions, and a NaN cotangent on padded rows: valid rows and all
    gradients equal the clean run; padded positions get exactly zero gradient."""
    pattern = PATTERNS[name]()
    q, k, v, ct = _inputs()
    allowed = _allowed(pattern)
    attended = allowed.any(2).reshape(B, G, H // G, N).any(2).transpose(0, 2, 1)  # [B, N, G]
    has_key = allowed.any(3).transpose(0, 2, 1)  # [B, N, H]
    pad = np.zeros((B, N), bool)
    pad[1, VL:] = True
    assert not attended[pad].any() and not has_key[pad].any()  # nobody attends padding, padding attends nothing
    bad = (np.nan, np.inf, -np.inf)
    dirty = (_plant(q, pad, bad), _plant(k, pad, bad[1:] + bad[:1]), _plant(v, pad, bad), _plant(ct, pad, (np.nan,)))
    want = [np.asarray(x) for x in _run(q, k, v, ct, pattern, impl)]
    got = [np.asarray(x) for x in _run(*dirty, pattern, impl)]
    for what, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_array_equal(g[~pad], w[~pad], err_msg=f"{what} at valid positions")
        if what in ("dq", "dk", "dv"):
            assert (g[pad] == 0).all(), f"{what} at padded positions"
    assert (got[0][pad] == 0).all() and np.isneginf(got[1][pad]).all()


@pytest.mark.parametrize("name,impl", CASES)
def test_excluded_pairs_inside_a_tile_stay_clean(name, impl):
    """NaN in v and k of keys that some rows of an 8-row tile attend and others do not, and in q of one valid row:
    exactly the rows that may attend them turn NaN; every other row, and every gradient not reached by those
    rows, equals the clean run."""
    pattern = PATTERNS[name]()
    q, k, v, ct = _inputs(1)
    allowed = _allowed(pattern)
    j_v, j_k, i_q = 10, 25, 12  # (batch 0)
    for j in (j_v, j_k):  # the test needs a tile that visits j with rows that may not attend it
        col = allowed[0, :, :, j].reshape(H, N // TILE, TILE)
        assert (col.any(-1) & ~col.all(-1)).any()
    qd = q.at[0, i_q, 1, 3].set(jnp.nan)
    kd = k.at[0, j_k, :, 5].set(jnp.nan)
    vd = v.at[0, j_v, :, 2].set(jnp.nan)
    poisoned = allowed[..., j_v] | allowed[..., j_k]  # [B, H, N] rows (b, i, h)
    poisoned[1] = False
    poisoned[0, 1, i_q] |= allowed[0, 1, i_q].any()
    poisoned = poisoned.transpose(0, 2, 1)  # [B, N, H]
    reached = (allowed & poisoned.transpose(0, 2, 1)[..., None]).any(2)  # [B, H, N] keys a poisoned row attends
    reached = reached.reshape(B, G, H // G, N).any(2).transpose(0, 2, 1)  # [B, N, G]
    assert poisoned.sum() > 0 and (~poisoned).sum() > 0 and (~reached).sum() > 0

    want = [np.asarray(x) for x in _run(q, k, v, ct, pattern, impl)]
    out, lse, dq, dk, dv = (np.asarray(x) for x in _run(qd, kd, vd, ct, pattern, impl))
    assert np.isnan(out[poisoned]).any(-1).all(), "a row that attends a NaN must show it"
    np.testing.assert_array_equal(out[~poisoned], want[0][~poisoned])
    np.testing.assert_array_equal(lse[~poisoned], want[1][~poisoned])
    np.testing.assert_array_equal(dq[~poisoned], want[2][~poisoned])
    np.testing.assert_array_equal(dk[~reached], want[3][~reached])
    np.testing.assert_array_equal(dv[~reached], want[4][~reached])


def test_huge_logits_pallas_matches_reference():
    """Logits around 1e10 with 8x8 tiles: the kernels' row maximum gets weight exactly 1 (no NaN, no -inf lse)."""
    q, k, v, _ = _inputs(2)
    q, k = q * 1e5, k * 1e5
    pattern = P.causal(N)
    want = sa.attention(q, k, v, pattern, implementation="reference", return_lse=True)
    assert float(jnp.abs(want[1]).max()) > 1e10
    for impl in ("triton", "mosaic"):
        run = functools.partial(sa.attention, pattern=pattern, implementation="pallas", return_lse=True, **IMPLS[impl])
        got = jax.jit(run)(q, k, v)
        np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-5, err_msg=impl)
        # float32 logits of this size carry absolute errors of ~1e-7 of the largest (dot products of 1e10 terms)
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-6 * float(jnp.abs(want[1]).max()), err_msg=impl)
