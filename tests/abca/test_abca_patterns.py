"""Placement, zones, stage intervals and handshake patterns against the loop definitions in oracles.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns import abca
from tests.abca import oracles

N = 24


def _cases():
    """(raw anchor mask [B, N], valid_len [B], max_zone): the edge cases, then random masks."""
    rng = np.random.default_rng(0)
    only0 = np.zeros((1, N), bool)
    at_end = np.zeros((1, N), bool)
    at_end[0, [0, N - 2, N - 1]] = True
    adjacent = np.zeros((1, N), bool)
    adjacent[0, [0, 1, 2, 5, 6, 7, 8]] = True
    padded = rng.random((1, N)) < 0.3
    no_zero = np.zeros((1, N), bool)
    no_zero[0, [4, 9]] = True
    cases = [
        (only0, [N], N),  # only position 0, no cap pressure
        (only0, [N], 5),  # zones over the cap: fallbacks every 5
        (at_end, [N], 30),  # anchors at the end (last zone of size 1)
        (adjacent, [N], 4),
        (padded, [13], 4),  # padding: anchors past valid_len are dropped
        (no_zero, [N], 7),  # position 0 missing: forced
        (np.ones((1, N), bool), [N], 1),  # every position an anchor
        (only0, [0], 3),  # an empty sequence
    ]
    for seed in range(3):
        r = np.random.default_rng(seed + 10)
        cases.append(
            (r.random((2, N)) < r.uniform(0.05, 0.5), list(r.integers(1, N + 1, size=2)), int(r.integers(1, 9)))
        )
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_cap_and_zones_match_loops(case):
    raw, vl, mz = CASES[case]
    vl = jnp.asarray(vl, jnp.int32)
    is_anchor, inserted = jax.jit(abca.enforce_zone_cap, static_argnums=2)(jnp.asarray(raw), vl, mz)
    zones = jax.jit(abca.compute_zones)(is_anchor, vl)
    for b in range(raw.shape[0]):
        want, want_ins = oracles.cap_anchors(raw[b], int(vl[b]), mz)
        np.testing.assert_array_equal(is_anchor[b], want)
        assert int(inserted[b]) == want_ins
        anchors = oracles.anchor_list(want, int(vl[b]))
        assert int(zones.num_anchors[b]) == len(anchors)
        for t in range(N):
            if t >= vl[b]:
                assert zones.left[b, t] == zones.right[b, t] == zones.zone_id[b, t] == -1
                continue
            left, right = oracles.left_right(t, anchors, int(vl[b]))
            assert (zones.left[b, t], zones.right[b, t]) == (left, right)
            assert zones.zone_id[b, t] == anchors.index(left)
            if t in anchors:
                j = anchors.index(t)
                assert zones.prev_anchor[b, t] == (anchors[j - 1] if j else -1)
                assert zones.next_anchor[b, t] == (anchors[j + 1] if j + 1 < len(anchors) else -1)
        sizes = np.asarray(abca.zone_sizes(zones))[b]
        assert sizes.sum() == vl[b] and sizes.max(initial=0) <= mz


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_stage_intervals_match_spec(case, causal):
    raw, vl, mz = CASES[case]
    vl = jnp.asarray(vl, jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(raw), vl, mz)
    zones = abca.compute_zones(is_anchor, vl)
    layer = abca.layer_intervals(zones, causal=causal, max_zone=mz).validate()  # validate checks the reach too
    gather = abca.gather_intervals(zones, causal=causal, max_zone=mz).validate()
    zone = abca.zone_intervals(zones, causal=causal, max_zone=mz).validate()
    for b in range(raw.shape[0]):
        want = oracles.layer_mask(np.asarray(is_anchor[b]), int(vl[b]), causal)
        np.testing.assert_array_equal(layer.to_dense()[b, 0], want)
        anchor_rows = np.asarray(is_anchor[b])[:, None]
        np.testing.assert_array_equal(gather.to_dense()[b, 0], want & anchor_rows)
        np.testing.assert_array_equal(zone.to_dense()[b, 0], want & ~anchor_rows)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_handshake_patterns_match_spec(case, causal):
    raw, vl, mz = CASES[case]
    vl = jnp.asarray(vl, jnp.int32)
    zones = abca.compute_zones(abca.enforce_zone_cap(jnp.asarray(raw), vl, mz)[0], vl)
    chain = abca.chain_handshake(zones, causal=causal).validate()
    assert chain.width == 3
    glob, overflow = abca.global_handshake(zones, max_anchors=4, causal=causal)
    glob.validate()
    for b in range(raw.shape[0]):
        a = np.asarray(zones.is_anchor[b])
        want = oracles.handshake_mask(a, int(vl[b]), causal)
        np.testing.assert_array_equal(chain.to_dense()[b, 0], want)
        want_g = oracles.handshake_mask(a, int(vl[b]), causal, "global", 4)
        np.testing.assert_array_equal(glob.to_dense()[b, 0], want_g)
        assert int(overflow[b]) == max(int(a.sum()) - 4, 0)
    # Unused slots name the row itself: a gather executor's backward scatter-adds every slot, and one shared index
    # for all of them (position 0 before) made N-way colliding adds (atomics on a GPU).
    for nl in (chain, glob):
        own = np.broadcast_to(np.arange(nl.idx.shape[2])[:, None], nl.idx.shape[2:])
        for b in range(raw.shape[0]):
            unused = ~np.asarray(nl.valid[b, 0])
            np.testing.assert_array_equal(np.asarray(nl.idx[b, 0])[unused], own[unused])


def test_fixed_and_explicit_placement():
    fixed = abca.fixed_interval_anchors(2, 10, 4)
    np.testing.assert_array_equal(fixed[1], np.arange(10) % 4 == 0)
    tokens = jnp.array([[5, 1, 7, 1], [1, 1, 2, 3]], jnp.int32)
    np.testing.assert_array_equal(abca.explicit_anchors(tokens_BxN=tokens, anchor_id=1, vocab_size=8), tokens == 1)
    mask = jnp.array([[True, False]])
    np.testing.assert_array_equal(abca.explicit_anchors(mask), mask)
    np.testing.assert_array_equal(abca.learned_anchors(jnp.array([[0.5, -1.0, 0.0]])), [[True, False, False]])


def test_placement_loss_and_straight_through():
    s = jnp.array([[2.0, -1.0, 0.5, 9.0]])
    y = jnp.array([[True, False, False, True]])
    loss = abca.placement_loss(s, y, jnp.array([3]))
    p = 1 / (1 + np.exp(-np.array([2.0, -1.0, 0.5])))
    want = -np.mean(np.log([p[0], 1 - p[1], 1 - p[2]]))
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    hard = s > 0
    gate = abca.straight_through_gate(s, hard)
    np.testing.assert_array_equal(gate, hard.astype(np.float32))
    g = jax.grad(lambda s: jnp.sum(abca.straight_through_gate(s, hard)))(s)
    np.testing.assert_allclose(
        g, p_all := 1 / (1 + np.exp(-np.asarray(s))) * (1 - 1 / (1 + np.exp(-np.asarray(s)))), rtol=1e-6
    )
    assert np.all(p_all > 0)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="max_zone"):
        abca.enforce_zone_cap(jnp.ones((1, 4), bool), None, 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        abca.explicit_anchors(tokens_BxN=jnp.zeros((1, 4), jnp.int32), anchor_id=9, vocab_size=8)
    with pytest.raises(ValueError, match=r"\[B, N\]"):
        abca.explicit_anchors(jnp.ones((4,), bool))
    with pytest.raises(ValueError, match="bool"):
        abca.enforce_zone_cap(jnp.ones((1, 4), jnp.int32), None, 2)
    with pytest.raises(ValueError, match="valid_len"):
        abca.compute_zones(jnp.ones((2, 4), bool), jnp.array([4], jnp.int32))
    with pytest.raises(ValueError, match="valid_len"):
        abca.compute_zones(jnp.ones((1, 4), bool), jnp.array([5], jnp.int32))
    with pytest.raises(ValueError, match="interval"):
        abca.fixed_interval_anchors(1, 4, 0)
    with pytest.raises(ValueError, match="max_anchors"):
        abca.global_handshake(abca.compute_zones(jnp.ones((1, 4), bool)), max_anchors=0, causal=False)
