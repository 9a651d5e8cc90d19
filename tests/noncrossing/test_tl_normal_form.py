"""Jones normal form: bijection, shortlex minimality, length bound, invalid input (docs/noncrossing.md, "Tests")."""

import math

import numpy as np
import pytest

from sparse_attn.patterns.noncrossing import diagram_np as dn
from sparse_attn.patterns.noncrossing import normal_form as nf
import tl_oracles


@pytest.mark.parametrize("n", range(1, 9))
def test_nf_of_every_diagram_rebuilds_it(n):
    lengths = []
    for d in dn.all_diagrams(n):
        w = nf.diagram_to_jones_nf(d)
        assert nf.is_jones_nf(w)
        assert np.array_equal(dn.word_to_diagram(w, n)[0], d)
        lengths.append(len(w))
    assert max(lengths) == n * n // 4


@pytest.mark.parametrize("n", range(1, 9))
def test_nf_words_count_catalan_and_map_bijectively(n):
    words = list(nf.all_jones_nfs(n))
    assert len(words) == math.comb(2 * n, n) // (n + 1)
    assert all(nf.is_jones_nf(w) for w in words)
    ds = {tuple(dn.word_to_diagram(w, n)[0]) for w in words}
    assert len(ds) == len(words)


@pytest.mark.parametrize("n", range(2, 7))
def test_nf_is_shortlex_minimal_word(n):
    first = tl_oracles.bfs_shortlex(n)
    assert len(first) == math.comb(2 * n, n) // (n + 1)
    for d, w in first.items():
        assert tuple(nf.diagram_to_jones_nf(np.array(d))) == w


def test_nf_of_random_words_larger_n():
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(2, 15))
        d, _ = dn.word_to_diagram(rng.integers(0, n - 1, int(rng.integers(0, 40))), n)
        w = nf.diagram_to_jones_nf(d)
        assert nf.is_jones_nf(w) and len(w) <= n * n // 4
        assert np.array_equal(dn.word_to_diagram(w, n)[0], d)


def test_is_jones_nf_examples():
    assert nf.is_jones_nf([]) and nf.is_jones_nf([1, 0, 2, 1]) and nf.is_jones_nf([0, 2])
    assert not nf.is_jones_nf([2, 0]) and not nf.is_jones_nf([0, 0]) and not nf.is_jones_nf([1, 0, 1])


def test_invalid_diagram_raises():
    with pytest.raises(ValueError, match="planar"):
        nf.diagram_to_jones_nf(np.array([3, 2, 1, 0]))
