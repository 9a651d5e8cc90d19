"""Rewriting: soundness of every rule, A–D reduces to the NF, non-confluence of the length-3 rules
(docs/noncrossing.md, "Tests")."""

import itertools

import numpy as np
import pytest

from sparse_attn.patterns.noncrossing import diagram_np as dn
from sparse_attn.patterns.noncrossing import normal_form as nf
from sparse_attn.patterns.noncrossing import rewriting as rw


def _d(w, n):
    return tuple(dn.word_to_diagram(np.array(w, np.int64), n)[0])


@pytest.mark.parametrize("n", range(2, 9))
def test_every_rule_is_sound(n):
    systems = [rw.seed_rules(n), rw.mirror_rules(n), rw.complete_rules(n)]
    for rules in systems:
        for lhs, rhs in rules.items():
            assert _d(lhs, n) == _d(rhs, n), (lhs, rhs)


@pytest.mark.parametrize("n", range(3, 9))
def test_complete_system_rule_count(n):
    m = n - 1
    assert len(rw.complete_rules(n)) == m + (m - 1) * (m - 2) // 2 + m * (m - 1)


@pytest.mark.parametrize("n", range(3, 8))
def test_complete_lhs_are_minimal_non_nf_words(n):
    for lhs, rhs in rw.complete_rules(n).items():
        assert not nf.is_jones_nf(lhs) and nf.is_jones_nf(lhs[1:]) and nf.is_jones_nf(lhs[:-1])
        assert list(rhs) == nf.diagram_to_jones_nf(np.array(_d(lhs, n)))


def test_complete_reduce_equals_nf_all_words_length_7_n5():
    n = 5
    rules = rw.complete_rules(n)
    count = 0
    for length in range(8):
        for w in itertools.product(range(n - 1), repeat=length):
            assert list(rw.reduce(w, rules)) == nf.diagram_to_jones_nf(np.array(_d(w, n))), w
            count += 1
    assert count == 21845


def test_complete_reduce_equals_nf_random_words():
    rng = np.random.default_rng(4)
    for _ in range(60):
        n = int(rng.integers(2, 10))
        w = rng.integers(0, n - 1, int(rng.integers(0, 25)))
        assert list(rw.reduce(w, rw.complete_rules(n))) == nf.diagram_to_jones_nf(np.array(_d(w, n)))


def test_seed_rules_nonconfluent_regression():
    out = rw.irreducible_descendants((2, 1, 2, 0), rw.seed_rules(4))
    assert out == {(0, 2), (2, 1, 0, 2)}
    assert len({_d(w, 4) for w in out}) == 1  # same diagram, two irreducible words


def test_seed_and_mirror_nonconfluent_regression():
    out = rw.irreducible_descendants((2, 0, 1, 0), rw.seed_and_mirror_rules(4))
    assert out == {(0, 2), (0, 2, 1, 0)}
    assert len({_d(w, 4) for w in out}) == 1


@pytest.mark.parametrize("n", range(3, 8))
def test_mirror_rule_is_needed(n):
    seed = rw.seed_rules(n)
    assert rw.reduce((0, 1, 0), seed) == (0, 1, 0) and rw.reduce((0,), seed) == (0,)
    assert _d((0, 1, 0), n) == _d((0,), n)
    assert rw.reduce((0, 1, 0), rw.seed_and_mirror_rules(n)) == (0,)


def test_short_rule_system_misses_nf_on_some_words_n5():
    n = 5
    rules = rw.seed_and_mirror_rules(n)
    misses = sum(
        list(rw.reduce(w, rules)) != nf.diagram_to_jones_nf(np.array(_d(w, n)))
        for length in range(8)
        for w in itertools.product(range(n - 1), repeat=length)
    )
    assert misses == 3024  # counted by an independent implementation (docs/noncrossing.md, "Tests")


def test_seed_one_pass_is_sound():
    rng = np.random.default_rng(5)
    for _ in range(100):
        n = int(rng.integers(2, 9))
        w = rng.integers(0, n - 1, int(rng.integers(0, 15)))
        assert _d(rw.seed_one_pass(w, n), n) == _d(w, n)


def test_reduce_terminates_with_irreducible_result():
    rules = rw.complete_rules(6)
    w = rw.reduce((4, 3, 4, 2, 2, 0, 1, 0), rules)
    assert rw.rewrite_once(w, rules) is None
