"""The packed executor against `attention(..., implementation="reference")` on the same Intervals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn
from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.patterns import abca

B, N, D = 2, 40, 8


def _zones(seed, max_zone, valid_len=(N, 23)):
    rng = np.random.default_rng(seed)
    vl = jnp.asarray(valid_len, jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, N)) < 0.2), vl, max_zone)
    return abca.compute_zones(is_anchor, vl)


def _qkv(seed, heads, groups):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        jax.random.normal(ks[0], (B, N, heads, D)),
        jax.random.normal(ks[1], (B, N, groups, D)),
        jax.random.normal(ks[2], (B, N, groups, D)),
    )


@pytest.mark.parametrize(
    "causal,heads,groups,max_zone,width", [(False, 2, 2, 6, 6), (True, 4, 2, 5, 9), (True, 1, 1, 1, 1)]
)
def test_packed_matches_reference(causal, heads, groups, max_zone, width):
    zones = _zones(heads + max_zone, max_zone)
    pattern = abca.zone_intervals(zones, causal=causal, max_zone=max_zone)
    layout = abca_packed.slot_layout(zones.left, zones.valid_len, width)
    q, k, v = _qkv(1, heads, groups)
    ct = jax.random.normal(jax.random.PRNGKey(9), q.shape)

    def packed(q, k, v):
        return abca_packed.packed_zone_attention(q, k, v, pattern.lo[:, 0], pattern.hi[:, 0], layout, 0.4, chunk=2)

    def ref(q, k, v):
        return sparse_attn.attention(q, k, v, pattern, implementation="reference", scale=0.4, return_lse=True)

    (o1, l1), (o2, l2) = jax.jit(packed)(q, k, v), jax.jit(ref)(q, k, v)
    np.testing.assert_allclose(o1, o2, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.isneginf(l1), np.isneginf(l2))
    np.testing.assert_allclose(np.where(np.isinf(l2), 0, l1), np.where(np.isinf(l2), 0, l2), atol=1e-5, rtol=1e-5)
    empty = ~np.asarray(pattern.to_dense()[:, 0].any(-1))  # anchors and padding: no allowed key
    assert empty.any() and np.all(np.asarray(o1)[empty] == 0)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v)[0] * ct)

    g1 = jax.jit(jax.grad(loss(packed), (0, 1, 2)))(q, k, v)
    g2 = jax.jit(jax.grad(loss(ref), (0, 1, 2)))(q, k, v)
    for a, b in zip(g1, g2, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    # Keys no query may read (padding of the short sequence) get exactly zero gradient.
    unread = ~np.asarray(pattern.to_dense()[:, 0].any(-2))
    assert unread.any()
    assert np.all(np.asarray(g1[1])[unread] == 0) and np.all(np.asarray(g1[2])[unread] == 0)


def test_slot_bound_holds_on_adversarial_gaps():
    """Gaps alternating 1 and max_zone make every slot hold one zone: the worst case the static count covers."""
    width = 5
    for gaps in ([1, width], [width, 1], [2, width - 1], [width]):
        pos, marks = 0, []
        while pos < N:
            marks.append(pos)
            pos += gaps[len(marks) % len(gaps)]
        is_anchor = jnp.zeros((1, N), bool).at[0, jnp.array(marks)].set(True)
        zones = abca.compute_zones(is_anchor, None)
        layout = abca_packed.slot_layout(zones.left, zones.valid_len, width)
        assert layout.start.shape[1] == abca_packed.max_slots(N, width)
        covered = np.asarray(layout.slot_of[0]) >= 0
        assert covered.all()
        start = np.asarray(layout.start[0])
        used = start[start < N]
        assert len(used) == int(layout.used[0])
        assert np.all(np.diff(np.append(used, N)) <= width)  # every slot holds at most `width` queries


def test_slot_loop_runs_used_slots_in_order_and_skips_the_rest():
    start = jnp.array([[0, 3, 7, 9, 40, 40, 40]])  # 4 used slots, padded to whole chunks of 3 below
    seen = abca_packed._slot_loop(start, jnp.array([4]), 3, 40, lambda acc, slot: acc * 10 + slot + 1, jnp.int32(0))
    # Chunks of 3 slots: the two chunks holding slots 0..5 run (steps past the last used chunk are skipped).
    assert int(seen) == 123456


@pytest.mark.parametrize("stage,causal", [("layer", False), ("gather", True), ("zones", False)])
def test_zone_pattern_packed_matches_its_reference_through_attention(stage, causal):
    """ABCA's own pattern type through the entry point: "packed" == "reference" (out, lse and gradients of both)."""
    zones = _zones(3, 6)
    pattern = abca.ZonePattern(zones, stage=stage, causal=causal, max_zone=6)
    q, k, v = _qkv(2, 4, 2)
    ct = jax.random.normal(jax.random.PRNGKey(5), q.shape)

    def run(impl):
        def f(q, k, v):
            out, lse = sparse_attn.attention(q, k, v, pattern, implementation=impl, scale=0.4, return_lse=True)
            return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

        return jax.jit(jax.value_and_grad(f, (0, 1, 2), has_aux=True))(q, k, v)

    ((_, (o1, l1)), g1), ((_, (o2, l2)), g2) = run("packed"), run("reference")
    np.testing.assert_allclose(o1, o2, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.isneginf(l1), np.isneginf(l2))
    np.testing.assert_allclose(np.where(np.isinf(l2), 0, l1), np.where(np.isinf(l2), 0, l2), atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    assert sparse_attn.default_implementation("cpu", abca.ZonePattern) == "packed"


def test_a_score_function_runs_on_the_zone_pattern_executors_that_take_one():
    """ALiBi + softcap on ABCA's pattern: "xla" == "reference" (out and gradients); "packed" refuses it by name."""
    from sparse_attn import score_fns as S

    zones = _zones(4, 6)
    pattern = abca.ZonePattern(zones, stage="layer", causal=True, max_zone=6)
    q, k, v = _qkv(3, 4, 2)
    score_fn = S.compose(S.alibi(S.alibi_slopes(4)), S.softcap(3.0))

    def run(impl):
        f = lambda q, k, v: jnp.sum(jnp.sin(sparse_attn.attention(q, k, v, pattern, implementation=impl,  # noqa: E731
                                                                  score_fn=score_fn)))  # fmt: skip
        return jax.value_and_grad(f, (0, 1, 2))(q, k, v)

    (l1, g1), (l2, g2) = run("xla"), run("reference")
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="applies no score function"):
        sparse_attn.attention(q, k, v, pattern, implementation="packed", score_fn=score_fn)
