"""Patterns whose values `validate` cannot check (traced under jit) mean the same in every executor.

* `Intervals.reach` is part of the rule: each row's range is cut to [i - left, i + right].
* A `NeighbourList` slot whose index lies outside [0, N) is invalid.
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
OPTS = {
    "reference": {},
    "xla": dict(block=8),
    "pallas": dict(config=KernelConfig(backend="triton", interpret=True, block_sizes=BlockSizes(block_q=8, block_k=8))),
}
TOL = dict(out=1e-5, grad=5e-5)  # float32, as in test_executors


def _inputs():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    shapes = ((B, N, H, D), (B, N, G, D), (B, N, G, D), (B, N, H, D))
    return tuple(jax.random.normal(key, s) for key, s in zip(ks, shapes, strict=True))


def _value_and_grads(make_pattern, impl, arrays, q, k, v, ct):
    """out and (dq, dk, dv) with the pattern built inside jit from traced `arrays`."""

    @jax.jit
    def run(arrays, q, k, v):
        pattern = make_pattern(*arrays)

        def loss(q, k, v):
            out = sa.attention(q, k, v, pattern, implementation=impl, **OPTS[impl])
            return jnp.sum(out * ct), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads, pattern.to_dense()

    return run(arrays, q, k, v)


def _assert_close(got, want):
    np.testing.assert_allclose(got[0], want[0], atol=TOL["out"], rtol=TOL["out"])
    for g, w in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(g, w, atol=TOL["grad"], rtol=TOL["grad"])


@pytest.mark.parametrize("impl", sorted(OPTS))
def test_reach_cuts_ranges_that_exceed_it(impl):
    """Ranges up to 7 keys beyond a declared reach of (3, 2), traced: every executor and `to_dense` cut them."""
    rng = np.random.default_rng(0)
    i = np.arange(N)
    lo = np.clip(i - rng.integers(0, 8, (B, 1, N)), 0, N - 1).astype(np.int32)
    hi = np.clip(i + rng.integers(0, 8, (B, 1, N)), 0, N - 1).astype(np.int32)
    vl = jnp.array([N, 27])
    reach = (3, 2)
    assert ((lo < i - reach[0]) | (hi > i + reach[1])).any()
    with pytest.raises(ValueError, match="reach"):  # concrete arrays are still checked
        P.Intervals(jnp.asarray(lo), jnp.asarray(hi), valid_len=vl, reach=reach).validate()
    make = functools.partial(P.Intervals, valid_len=vl, reach=reach)
    cut = P.Intervals(jnp.asarray(np.maximum(lo, i - reach[0])), jnp.asarray(np.minimum(hi, i + reach[1])),
                      valid_len=vl, reach=reach).validate()  # fmt: skip
    q, k, v, ct = _inputs()
    want = _value_and_grads(lambda: cut, "reference", (), q, k, v, ct)
    got = _value_and_grads(make, impl, (jnp.asarray(lo), jnp.asarray(hi)), q, k, v, ct)
    np.testing.assert_array_equal(got[2], want[2])  # to_dense
    _assert_close(got, want)


@pytest.mark.parametrize("impl", sorted(set(OPTS) & set(sa.available_implementations(P.NeighbourList))))
def test_neighbour_index_outside_the_sequence_is_an_invalid_slot(impl):
    """Valid slots pointing at N, N + 5 and -1, traced: every executor treats them as invalid (no clamping)."""
    rng = np.random.default_rng(1)
    idx = np.stack([np.tile(np.arange(N), (B, 1)), rng.integers(0, N, (B, N))], -1).astype(np.int32)
    valid = np.ones_like(idx, bool)
    valid[..., 1] = idx[..., 1] != idx[..., 0]
    idx[0, 3, 1], idx[0, 9, 1], idx[1, 4, 1], idx[1, 30, 0] = N, N + 5, -1, N  # valid slots, out of range
    valid[0, 3, 1] = valid[0, 9, 1] = valid[1, 4, 1] = valid[1, 30, 0] = True
    idx, valid = jnp.asarray(idx)[:, None], jnp.asarray(valid)[:, None]
    with pytest.raises(ValueError, match="outside"):  # concrete arrays are still checked
        P.NeighbourList(idx, valid).validate()
    inside = (idx >= 0) & (idx < N)
    dropped = P.NeighbourList(jnp.where(inside, idx, 0), valid & inside).validate()
    q, k, v, ct = _inputs()
    want = _value_and_grads(lambda: dropped, "reference", (), q, k, v, ct)
    got = _value_and_grads(P.NeighbourList, impl, (idx, valid), q, k, v, ct)
    np.testing.assert_array_equal(got[2], want[2])  # to_dense
    _assert_close(got, want)
