"""`patterns.labels.counts`: allowed keys per query by inclusion-exclusion over label subsets, against the dense
mask of `LabelPattern` (window, landmarks, causal, padding, k = 1..4, repeated labels)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.counts import label_key_counts
from sparse_attn.patterns.labels.pattern import LabelPattern


@pytest.mark.parametrize(
    "n,d,k,radius,landmarks,causal,valid",
    [(50, 6, 2, 7, 0, False, 37), (64, 5, 3, 9, 11, True, 64), (40, 8, 1, 5, 6, False, 33),
     (33, 4, 4, 40, 0, False, 20)],
)
def test_counts_equal_the_dense_mask(n, d, k, radius, landmarks, causal, valid):
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(n), (1, 1, n, d)), k)
    base = BaseGraph(radius=radius, landmark_every=landmarks, causal=causal)
    pattern = LabelPattern.from_labels(labels, d, base=base, valid_len=jnp.asarray([valid]))
    got = jax.jit(lambda lab: label_key_counts(lab, d, base, valid))(labels[0, 0])
    np.testing.assert_array_equal(got, np.asarray(pattern.to_dense()).sum(-1)[0, 0])


def test_repeated_labels_count_once():
    labels = jax.random.randint(jax.random.PRNGKey(3), (1, 1, 40, 3), 0, 4)  # many tokens repeat a label
    assert bool(jnp.any(labels[..., 0] == labels[..., 1]))
    base = BaseGraph(radius=6)
    pattern = LabelPattern.from_labels(labels, 4, base=base)
    np.testing.assert_array_equal(label_key_counts(labels[0, 0], 4, base), np.asarray(pattern.to_dense()).sum(-1)[0, 0])
