"""Prepared patterns (`sparse_attn.prepare`): the same outputs and gradients as the unprepared pattern for every
executor that prepares, through `jax.jit` as an argument and `jax.tree.map`; clear errors on a mismatched call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn
from sparse_attn import patterns
from sparse_attn.executors import registry
from sparse_attn.executors.pallas import KernelMeta
from sparse_attn.kernels import BlockSizes, KernelConfig
from sparse_attn.patterns import abca
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.patterns.labels import bits
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

B, N, H, G, D = 2, 32, 4, 2, 8


def _qkv(seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (B, N, H, D))
    k, v = (jax.random.normal(x, (B, N, G, D)) for x in ks[1:3])
    return q, k, v, jax.random.normal(ks[3], q.shape)


def _zone_pattern(stage="layer", causal=False, max_zone=6):
    rng = np.random.default_rng(3)
    vl = jnp.asarray([N, 21], jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, N)) < 0.2), vl, max_zone)
    return ZonePattern(abca.compute_zones(is_anchor, vl), stage=stage, causal=causal, max_zone=max_zone)


def _labels():
    """Label buckets shared by heads, a shorter second sequence, one label batch row for two q rows."""
    labels = bits.top_k_labels(jax.random.normal(jax.random.PRNGKey(2), (1, 1, N, 8)), 2)
    base = BaseGraph(radius=6, landmark_every=8, causal=True)
    return LabelPattern.from_labels(labels, 8, base=base, valid_len=jnp.asarray([N, 27]))


def _bigbird():
    n_pad = jnp.asarray([N, 25], jnp.int32)
    return patterns.bigbird(N, 4, 2, 1, 8, jax.random.PRNGKey(1), causal=False, valid_len=n_pad)


_TINY = KernelConfig(block_sizes=BlockSizes(block_q=16, block_k=16, block_q_bwd=8, block_k_bwd=16))
CASES = {
    "xla-bigbird": (_bigbird, "xla", {}),  # global rows, global keys and random blocks: every XlaMeta field
    "pallas-longformer": (lambda: patterns.longformer(N, 5, 2, causal=True), "pallas", {"config": _TINY}),
    "packed-layer": (lambda: _zone_pattern(causal=True), "packed", {"slot_width": 8}),  # roles and slots
    "bucketed-labels": (_labels, "bucketed", {"block": 16}),  # the bucket layouts
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_equals_unprepared(case):
    build, impl, options = CASES[case]
    pattern = build()
    prepared = sparse_attn.prepare(pattern, implementation=impl, head_dim=D, **options)
    assert prepared.implementation == impl and jax.tree.leaves(prepared.metadata)
    q, k, v, ct = _qkv()

    def loss(q, k, v, pat, **kw):
        out, lse = sparse_attn.attention(q, k, v, pat, return_lse=True, **kw)
        return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

    @jax.jit
    def both(q, k, v, prepared, pattern):  # the prepared pattern is a jit argument like any pytree
        grad = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)
        return grad(q, k, v, prepared), grad(q, k, v, pattern, implementation=impl, **options)

    ((_, (o1, l1)), g1), ((_, (o2, l2)), g2) = both(q, k, v, prepared, pattern)
    assert np.all(np.isfinite(o1))
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)
    for a, b in zip(g1, g2, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)


def test_prepared_is_a_pytree():
    # Traced shapes only (no compilation): `prepare` runs under tracing, as it does inside a jitted model.
    prep = lambda stage, impl, **kw: jax.eval_shape(  # noqa: E731
        lambda: sparse_attn.prepare(_zone_pattern(stage), implementation=impl, head_dim=D, **kw)
    )
    prepared = prep("layer", "packed")
    moved = jax.tree.map(lambda x: x, prepared)
    assert type(moved) is sparse_attn.Prepared and moved.implementation == "packed"
    assert jax.tree.structure(moved) == jax.tree.structure(prepared)
    # The metadata's arrays are leaves (so they shard and donate like the pattern's), beside the pattern's own.
    assert len(jax.tree.leaves(prepared)) > len(jax.tree.leaves(prepared.pattern))
    assert moved.metadata.slots.width == 6 and moved.metadata.roles.shape == (3, B, N)
    # A mechanism pattern run through its Intervals carries the Intervals executor's metadata.
    via = prep("zones", "pallas", config=_TINY)
    assert type(via.metadata) is KernelMeta and via.metadata.lists_f.block_q == 16


def test_prepared_errors():
    pattern = patterns.sliding_window(N, 4, causal=True)
    q, k, v = jnp.zeros((B, N, H, D)), jnp.zeros((B, N, G, D)), jnp.zeros((B, N, G, D))
    prepared = sparse_attn.prepare(pattern, implementation="xla", block=8)
    with pytest.raises(ValueError, match="prepared for implementation 'xla', not 'pallas'"):
        sparse_attn.attention(q, k, v, prepared, implementation="pallas")
    with pytest.raises(ValueError, match="option block=16 differs"):
        sparse_attn.attention(q, k, v, prepared, block=16)
    with pytest.raises(ValueError, match="pass executor options to prepare"):
        sparse_attn.attention(q, k, v, sparse_attn.prepare(pattern, implementation="xla"), block=8)
    with pytest.raises(ValueError, match="already prepared"):
        sparse_attn.prepare(prepared)
    with pytest.raises(ValueError, match="needs head_dim"):
        sparse_attn.prepare(pattern, implementation="pallas")
    with pytest.raises(ValueError, match=f"prepared for head_dim=16, but q has D={D}"):
        sparse_attn.attention(q, k, v, sparse_attn.prepare(pattern, implementation="xla", head_dim=16))
    with pytest.raises(ValueError, match="implementation must be None or one of"):
        sparse_attn.prepare(pattern, implementation="packed")
    with pytest.raises(ValueError, match="must be hashable"):
        sparse_attn.prepare(pattern, implementation="xla", block=[8])
    with pytest.raises(ValueError, match="pattern covers"):
        sparse_attn.attention(q[:, :16], k[:, :16], v[:, :16], prepared)


def test_prepare_without_metadata_still_runs():
    """An executor that registered no `prepare` (the oracle, neighbour lists) gets a Prepared with no metadata and
    runs as before; `implementation=None` resolves now, to the platform default."""
    assert registry.preparer(patterns.NeighbourList, "xla") is None
    pattern = patterns.sliding_window(N, 2, causal=False)
    ref = sparse_attn.prepare(pattern, implementation="reference")
    assert ref.metadata is None
    q, k, v = jnp.zeros((B, N, H, D)), jnp.zeros((B, N, G, D)), jnp.zeros((B, N, G, D))
    out = jax.eval_shape(lambda p: sparse_attn.attention(q, k, v, p, return_lse=True), ref)  # traced, not compiled
    assert out[0].shape == q.shape and out[1].shape == (B, N, H)
    assert sparse_attn.prepare(pattern).implementation == sparse_attn.default_implementation()
