"""Property tests (hypothesis) of the pattern builders against dense numpy oracles written from their rules: random
lengths, radii, padding, anchors, label sets and segment ids. Derandomized: the same examples on every run."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparse_attn import patterns as P
from sparse_attn.patterns import abca
from sparse_attn.patterns.labels import BaseGraph, LabelPattern
from sparse_attn.patterns.mask_fns import and_masks, causal_mask, chunked_mask, document_mask, sliding_window_mask
from tests.abca import oracles

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


def grid(n):
    return np.arange(n)[:, None], np.arange(n)[None, :]


@st.composite
def lengths(draw, low=1, high=40):
    """(n, valid_len): a length and a valid prefix of it."""
    n = draw(st.integers(low, high))
    return n, draw(st.integers(1, n))


@SETTINGS
@given(lengths(), st.integers(0, 45), st.booleans())
def test_sliding_window_is_its_rule(nv, radius, causal):
    n, vl = nv
    i, j = grid(n)
    want = (abs(i - j) <= radius) & (i < vl) & (j < vl) & (~causal | (j <= i))
    got = np.asarray(P.sliding_window(n, radius, causal=causal, valid_len=jnp.asarray([vl])).to_dense())
    np.testing.assert_array_equal(got[0, 0], want)


@SETTINGS
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.booleans())
def test_document_mask_is_its_rule(ids, causal):
    ids = np.sort(np.asarray(ids, np.int32))
    n = len(ids)
    i, j = grid(n)
    want = (ids[i] == ids[j]) & (~causal | (j <= i))
    got = np.asarray(P.document_mask(jnp.asarray(ids[None]), causal=causal).to_dense())
    np.testing.assert_array_equal(got[0, 0], want)
    from_fn = P.from_mask_fn(document_mask(ids[None]), n, n, batch=1, block_size=min(8, n))
    np.testing.assert_array_equal(np.asarray(from_fn.to_dense())[0, 0], ids[i] == ids[j])


@SETTINGS
@given(lengths(2, 40), st.data(), st.booleans())
def test_abca_layer_pattern_is_its_rule(nv, data, causal):
    n, vl = nv
    raw = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    max_zone = data.draw(st.integers(1, 8))
    capped, _ = oracles.cap_anchors(raw, vl, max_zone)
    zones = abca.compute_zones(jnp.asarray(capped[None]), jnp.asarray([vl]))
    got = np.asarray(abca.layer_intervals(zones, causal=causal, max_zone=max_zone).to_dense())[0, 0]
    np.testing.assert_array_equal(got, oracles.layer_mask(capped, vl, causal))


@SETTINGS
@given(lengths(2, 40), st.data())
def test_label_pattern_is_base_graph_and_a_shared_label(nv, data):
    n, vl = nv
    radius, every = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 7))
    causal = data.draw(st.booleans())
    num_labels, k = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 3))
    labels = np.asarray(data.draw(st.lists(st.lists(st.integers(0, num_labels - 1), min_size=k, max_size=k,
                                                    unique=True) if k <= num_labels else st.just([0]),
                                           min_size=n, max_size=n)), np.int32)  # fmt: skip
    base = BaseGraph(radius=radius, landmark_every=every, causal=causal)
    pattern = LabelPattern.from_labels(jnp.asarray(labels[None, None]), num_labels, base=base,
                                       valid_len=jnp.asarray([vl]))  # fmt: skip
    i, j = grid(n)
    window = ((i - j >= 0) & (i - j <= radius)) if causal else (abs(i - j) <= radius)
    landmark = (j % every == 0) & (~causal | (j <= i)) if every else np.zeros((n, n), bool)
    share = np.array([[bool(set(labels[a]) & set(labels[b])) for b in range(n)] for a in range(n)])
    want = (window | landmark) & share & (i < vl) & (j < vl)
    np.testing.assert_array_equal(np.asarray(pattern.to_dense())[0, 0], want)


@SETTINGS
@given(st.integers(1, 48), st.integers(1, 48), st.integers(0, 12), st.integers(1, 9), st.integers(1, 16))
def test_mask_function_blocks_are_sound_and_the_mask_is_its_rule(nq, nk, radius, chunk, block):
    """Interval-bound classification never calls a block FULL or EMPTY wrongly; to_dense is the predicate."""
    fn = and_masks(causal_mask, sliding_window_mask(radius)) if chunk % 2 else chunked_mask(chunk)
    block = (min(block, nq), min(block, nk))
    pattern = P.from_mask_fn(fn, nq, nk, block_size=block)
    i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]
    want = ((j <= i) & (i - j <= radius)) if chunk % 2 else (i // chunk == j // chunk)
    np.testing.assert_array_equal(np.asarray(pattern.to_dense())[0, 0], want)
    exact = np.asarray(P.from_mask_fn(fn, nq, nk, block_size=block, exhaustive=True).block_state)
    got = np.asarray(pattern.block_state)
    assert np.all((got != 2) | (exact == 2)) and np.all((got != 0) | (exact == 0))
