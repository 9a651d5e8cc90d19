"""Non-crossing attention, reliability: valid_len > n is refused, padded rows output 0, non-finite values stay put.

The guarantee (docs/noncrossing.md): padding of x, q, k, v changes nothing, forward or backward, and padded rows
output 0; a non-finite q, k or v at a valid position changes only the rows whose key row holds it (they become
NaN). Inside jit a traced valid_len is clamped to [0, n].
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig

D, H, N = 16, 2, 12
VL = (N, 7)
BAD = (jnp.nan, jnp.inf, -jnp.inf)


def _ctx(valid_len):
    return AttentionContext(valid_len=jnp.asarray(valid_len, jnp.int32))


def _padding():
    return np.arange(N)[None, :] >= np.asarray(VL)[:, None]  # [B, N]


def test_valid_len_beyond_the_sequence_is_refused_and_clamped_under_jit():
    m = NoncrossingAttentionConfig(num_route_layers=2).make(D, H, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, N, D))
    with pytest.raises(ValueError, match=r"valid_len \[13, 7\] must lie in \[0, 12\]"):
        m(x, _ctx([N + 1, 7]))
    with pytest.raises(ValueError, match="valid_len"):
        m(x, _ctx([-1, 7]))
    run = jax.jit(lambda x, vl: m(x, _ctx(vl)).y)
    np.testing.assert_array_equal(run(x, jnp.asarray([N + 5, 7])), run(x, jnp.asarray([N, 7])))


@pytest.mark.parametrize("kw", [{}, {"edge_mlp_dim": 4}])
def test_padding_is_invisible_and_padded_rows_output_zero(kw):
    m = NoncrossingAttentionConfig(num_route_layers=2, **kw).make(D, H, rngs=nnx.Rngs(1))
    graphdef, params = nnx.split(m)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, N, D))
    ct = jax.random.normal(jax.random.PRNGKey(2), x.shape)

    @jax.jit
    def run(params, x):
        def loss(params, x):
            y = nnx.merge(graphdef, params)(x, _ctx(VL)).y
            return jnp.sum(y * ct), y

        return jax.grad(loss, (0, 1), has_aux=True)(params, x)

    (gp_clean, gx_clean), y_clean = run(params, x)
    pad = _padding()
    assert np.all(np.asarray(y_clean)[pad] == 0)  # padded query rows output 0 (they used to keep their own value)
    for value in BAD:
        (gp, gx), y = run(params, jnp.where(jnp.asarray(pad)[..., None], value, x))
        np.testing.assert_array_equal(y, y_clean)
        np.testing.assert_array_equal(gx, gx_clean)
        assert np.all(np.asarray(gx)[pad] == 0)
        jax.tree.map(np.testing.assert_array_equal, gp, gp_clean)


@pytest.mark.parametrize("kw", [{}, {"edge_mlp_dim": 4}])
def test_core_nonfinite_values_reach_only_the_rows_that_read_them(kw):
    m = NoncrossingAttentionConfig(num_route_layers=2, **kw).make(D, H, rngs=nnx.Rngs(3))
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    x = jax.random.normal(ks[0], (2, N, D))
    qkv = [jax.random.normal(kk, (2, N, H, D // H)) for kk in ks[1:]]
    vl = jnp.asarray(VL, jnp.int32)
    core = jax.jit(lambda q, k, v: m.core(x, q, k, v, vl)[0])
    nl = jax.jit(lambda x: m.pattern(m.route(x, vl), vl))(x)
    idx, valid = np.asarray(nl.idx), np.asarray(nl.valid)  # [B, H, N, K]
    o_clean = np.asarray(core(*qkv))
    pad = jnp.asarray(_padding())[..., None, None]
    for value in BAD:  # q, k, v at padding at once
        np.testing.assert_array_equal(core(*(jnp.where(pad, value, a) for a in qkv)), o_clean)
    b, j = 1, 3
    for which in range(3):
        if which == 0:
            readers = np.zeros((2, H, N), bool)
            readers[b, :, j] = True
        else:
            readers = np.any(valid & (idx == j), axis=-1)
            readers[1 - b] = False
        readers = np.swapaxes(readers, 1, 2)  # [B, N, H]
        assert readers.any() and (~readers).any()
        for value in BAD:
            planted = list(qkv)
            planted[which] = planted[which].at[b, j].set(value)
            o = np.asarray(core(*planted))
            np.testing.assert_array_equal(o[~readers], o_clean[~readers])
            assert np.all(np.isnan(o[readers]))
