"""Non-finite values (docs/abca.md): NaN/inf at padding are invisible; at a valid position they reach only its readers.

The guarantee (docs/abca.md): padding of q, k, v (and of the layer input) changes nothing, forward or backward; a
non-finite value at a valid position makes exactly the rows that read it NaN; the packed executor's gradients of a
loss that skips those rows equal a clean run's, with exactly 0 at the planted position. The core is checked on the
default "packed" path and on "reference" (its stages through the generic executors).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.modules.abca import AnchorAttentionConfig, AnchorProjections, LearnedAnchors, abca_core
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca

B, N, D, MZ = 2, 24, 8, 5
VL = (N, 15)
BAD = (jnp.nan, jnp.inf, -jnp.inf)


def _zones(seed=3):
    rng = np.random.default_rng(seed)
    vl = jnp.asarray(VL, jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, N)) < 0.25), vl, MZ)
    return abca.compute_zones(is_anchor, vl)


def _qkv(seed, heads=4, groups=2):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    shapes = [(B, N, heads, D), (B, N, groups, D), (B, N, groups, D)]
    return [jax.random.normal(kk, s) for kk, s in zip(ks, shapes, strict=True)]


def _plant(xs, which, b, pos, value):
    xs = list(xs)
    xs[which] = xs[which].at[b, pos].set(value)
    return xs


def _padding():
    return np.arange(N)[None, :] >= np.asarray(VL)[:, None]  # [B, N]


def test_packed_executor_isolates_nonfinite_values():
    zones = _zones()
    pattern = abca.zone_intervals(zones, causal=False, max_zone=MZ)
    layout = abca_packed.slot_layout(zones.left, zones.valid_len, MZ)
    allowed = np.asarray(pattern.to_dense()[:, 0])  # [B, N, N]
    qkv = _qkv(0)
    ct = jax.random.normal(jax.random.PRNGKey(7), qkv[0].shape)

    @jax.jit
    def run(q, k, v, rows_BxN):
        def loss(q, k, v):
            out, lse = abca_packed.packed_zone_attention(q, k, v, pattern.lo[:, 0], pattern.hi[:, 0], layout, 0.3)
            return jnp.sum(jnp.where(rows_BxN[..., None, None], out * ct, 0.0)), (out, lse)

        return jax.grad(loss, (0, 1, 2), has_aux=True)(q, k, v)

    everyone = jnp.ones((B, N), bool)
    g_clean, (o_clean, lse_clean) = run(*qkv, everyone)
    pad = _padding()
    # Padding (every tensor at once): nothing changes, padded positions get exactly zero gradient.
    for value in BAD:
        planted = [jnp.where(jnp.asarray(pad)[..., None, None], value, x) for x in qkv]
        g, (o, lse) = run(*planted, everyone)
        np.testing.assert_array_equal(o, o_clean)
        np.testing.assert_array_equal(lse, lse_clean)
        for a, c in zip(g, g_clean, strict=True):
            np.testing.assert_array_equal(a, c)
            assert np.all(np.asarray(a)[pad] == 0)
    # One valid position j: only the rows that read it change (to NaN); a loss over the others is unaffected.
    b = 0
    j = int(np.flatnonzero(allowed[b].any(-1))[len(allowed[b]) // 4])  # a zone token (anchor rows are empty)
    for which in range(3):
        readers = allowed[:, :, j].copy() if which else np.zeros((B, N), bool)
        if which == 0:
            readers[b, j] = allowed[b, j].any()
        readers[1 - b] = False
        assert readers.any() and (~readers).any()
        rows = jnp.asarray(~readers)
        g_ref, (o_ref, _) = run(*qkv, rows)
        for value in BAD:
            g, (o, _) = run(*_plant(qkv, which, b, j, value), rows)
            o = np.asarray(o)
            np.testing.assert_array_equal(o[~readers], np.asarray(o_ref)[~readers])
            assert np.all(np.isnan(o[readers]))
            for a, c in zip(g, g_ref, strict=True):
                assert np.all(np.isfinite(a))
                np.testing.assert_array_equal(a, c)
            assert np.all(np.asarray(g[which])[b, j] == 0)


def _core_fn(zones, **kw):
    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    proj = AnchorProjections(*(0.4 * jax.random.normal(kk, (4, D, D)) for kk in ks), rope_base=100.0)

    def f(q, k, v):
        return abca_core(q, k, v, zones, proj, max_zone=MZ, **kw)[0]

    return f


@pytest.mark.parametrize("implementation", ["packed", "reference"])  # "reference": the generic executors' guarantee
def test_core_padding_is_invisible_and_valid_nonfinite_reaches_only_readers(implementation):
    zones = _zones(4)
    core = _core_fn(zones, handshake_steps=2, implementation=implementation)
    qkv = _qkv(1)
    ct = jax.random.normal(jax.random.PRNGKey(8), qkv[0].shape)
    run = jax.jit(lambda q, k, v: jax.value_and_grad(lambda *a: jnp.sum(core(*a) * ct), (0, 1, 2))(q, k, v))
    fwd = jax.jit(core)
    pad = _padding()
    o_clean = np.asarray(fwd(*qkv))
    loss_clean, g_clean = run(*qkv)
    assert np.all(o_clean[pad] == 0)
    for value in BAD:
        planted = [jnp.where(jnp.asarray(pad)[..., None, None], value, x) for x in qkv]
        np.testing.assert_array_equal(fwd(*planted), o_clean)
        loss_value, g = run(*planted)
        np.testing.assert_array_equal(loss_value, loss_clean)
        for a, c in zip(g, g_clean, strict=True):
            np.testing.assert_array_equal(a, c)
            assert np.all(np.asarray(a)[pad] == 0)
    # A valid position: the rows whose output depends on it (found by a finite perturbation) become NaN, the
    # rest keep their clean values exactly, through the gather, the handshake and the zones.
    b, j = 0, 2
    for which in range(3):
        moved = _plant(qkv, which, b, j, qkv[which][b, j] + 3.0)
        readers = np.any(np.asarray(fwd(*moved)) != o_clean, axis=(-1, -2))
        assert readers.any() and (~readers).any()
        for value in BAD:
            o = np.asarray(fwd(*_plant(qkv, which, b, j, value)))
            np.testing.assert_array_equal(o[~readers], o_clean[~readers])
            assert np.all(np.isnan(o[readers]))


def test_module_ignores_nonfinite_hidden_states_at_padding():
    cfg = AnchorAttentionConfig(
        placement=LearnedAnchors(straight_through=True, boundary_ids=(1,), score_bias_init=0.0), max_zone=4
    )
    module = cfg.make(16, 2, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(2), (B, N, 16))
    tokens = jax.random.randint(jax.random.PRNGKey(3), (B, N), 0, 4)
    ctx = AttentionContext(valid_len=jnp.asarray(VL, jnp.int32), tokens=tokens)
    graphdef, params = nnx.split(module)
    ct = jax.random.normal(jax.random.PRNGKey(4), x.shape)

    @jax.jit
    def run(params, x):
        def loss(params, x):
            out = nnx.merge(graphdef, params)(x, ctx)
            return jnp.sum(out.y * ct) + sum(out.aux_losses.values()), out.y

        return jax.grad(loss, (0, 1), has_aux=True)(params, x)

    (gp_clean, gx_clean), y_clean = run(params, x)
    pad = jnp.asarray(_padding())[..., None]
    for value in BAD:
        (gp, gx), y = run(params, jnp.where(pad, value, x))
        np.testing.assert_array_equal(y, y_clean)
        np.testing.assert_array_equal(gx, gx_clean)
        assert np.all(np.asarray(gx)[_padding()] == 0)
        jax.tree.map(np.testing.assert_array_equal, gp, gp_clean)
