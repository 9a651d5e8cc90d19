"""Host TL diagrams: enumeration, composition, homomorphism, invariants, brick walls (docs/noncrossing.md, "Tests")."""

import itertools
import math

import numpy as np
import pytest

from sparse_attn.patterns.noncrossing import diagram_np as dn
import tl_oracles


def catalan(n):
    return math.comb(2 * n, n) // (n + 1)


@pytest.mark.parametrize("n", range(1, 9))
def test_enumeration_counts_catalan_and_all_valid(n):
    ds = dn.all_diagrams(n)
    assert len(ds) == catalan(n)
    assert len({tuple(d) for d in ds}) == catalan(n)
    assert all(dn.is_valid(d) for d in ds)


@pytest.mark.parametrize("n", range(1, 7))
def test_bfs_closure_from_identity_is_all_diagrams(n):
    reached = {tuple(dn.identity(n))}
    frontier = list(reached)
    while frontier:
        nxt = []
        for d in frontier:
            for i in range(n - 1):
                p = np.array(d)
                dn.rmul_gen(p, i)
                if tuple(p) not in reached:
                    reached.add(tuple(p))
                    nxt.append(tuple(p))
        frontier = nxt
    assert reached == {tuple(d) for d in dn.all_diagrams(n)}


def test_is_valid_rejects_crossing_and_non_involution():
    n = 2
    assert dn.is_valid(dn.identity(n))
    assert not dn.is_valid(np.array([3, 2, 1, 0]))  # top0-bottom1, top1-bottom0 cross
    assert not dn.is_valid(np.array([1, 0, 2, 2]))  # fixed points
    assert not dn.is_valid(np.array([1, 2, 0, 3]))  # not an involution
    assert not dn.is_valid(np.array([1.0, 0.0, 3.0, 2.0]))


def test_associativity_all_triples_n4():
    ds = dn.all_diagrams(4)
    prods = {}
    for i, a in enumerate(ds):
        for j, b in enumerate(ds):
            prods[i, j] = dn.compose(a, b)
    index = {tuple(d): k for k, d in enumerate(ds)}
    for i, j, k in itertools.product(range(len(ds)), repeat=3):
        ab, l_ab = prods[i, j]
        bc, l_bc = prods[j, k]
        left, l1 = dn.compose(ab, ds[k])
        right, l2 = prods[i, index[tuple(bc)]]
        assert np.array_equal(left, right)
        assert l_ab + l1 == l_bc + l2


def test_homomorphism_and_independent_stack_oracle():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(2, 10))
        u = rng.integers(0, n - 1, int(rng.integers(0, 12)))
        v = rng.integers(0, n - 1, int(rng.integers(0, 12)))
        du, lu = dn.word_to_diagram(u, n)
        dv, lv = dn.word_to_diagram(v, n)
        duv, luv = dn.word_to_diagram(np.concatenate([u, v]), n)
        prod, mid = dn.compose(du, dv)
        assert np.array_equal(prod, duv)
        assert luv == lu + lv + mid
        oracle, oracle_loops = tl_oracles.stacked_word_diagram([int(i) for i in np.concatenate([u, v])], n)
        assert np.array_equal(oracle, duv) and oracle_loops == luv


def test_compose_equals_rmul_and_lmul_sequences():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(2, 9))
        d1 = dn.word_to_diagram(rng.integers(0, n - 1, 6), n)[0]
        w = rng.integers(0, n - 1, int(rng.integers(1, 8)))
        dw, lw = dn.word_to_diagram(w, n)
        want, want_loops = dn.compose(d1, dw)
        p = d1.copy()
        loops = sum(dn.rmul_gen(p, int(i)) for i in w)
        assert np.array_equal(p, want) and loops == want_loops + lw
        q = dw.copy()  # the same product built from the other side: e_{i_T}, ..., e_{i_1} applied on top of dw
        d1_word = rng.integers(0, n - 1, 5)
        d1b, l1b = dn.word_to_diagram(d1_word, n)
        loops = sum(dn.lmul_gen(q, int(i)) for i in d1_word[::-1])
        want, want_loops = dn.compose(d1b, dw)
        assert np.array_equal(q, want) and loops == want_loops + l1b


def test_generator_diagrams_and_extraction():
    p = dn.generator(4, 1)
    assert dn.caps(p) == [(1, 2)] and dn.cups(p) == [(1, 2)]
    assert dn.through_strands(p) == [(0, 0), (3, 3)]
    assert dn.rank(dn.identity(5)) == 5


def test_invariants_on_random_words():
    rng = np.random.default_rng(2)
    for _ in range(60):
        n = int(rng.integers(2, 21))
        p = dn.identity(n)
        prev_caps, prev_rank = set(), n
        for i in rng.integers(0, n - 1, 30):
            dn.rmul_gen(p, int(i))
            assert dn.is_valid(p)
            th = dn.through_strands(p)
            assert len(th) % 2 == n % 2
            bs = [b for _, b in th]
            assert bs == sorted(bs)  # order preserving (tops are listed in order)
            for a, a2 in dn.caps(p):  # no cap or cup encloses a defect
                assert not any(a < t < a2 for t, _ in th)
            for b, b2 in dn.cups(p):
                assert not any(b < x < b2 for x in bs)
            caps_now = set(dn.caps(p))
            assert prev_caps <= caps_now and len(th) <= prev_rank
            prev_caps, prev_rank = caps_now, len(th)


@pytest.mark.parametrize("n", range(1, 9))
def test_rank_histogram_is_squared_link_state_counts(n):
    hist = {}
    for d in dn.all_diagrams(n):
        hist[dn.rank(d)] = hist.get(dn.rank(d), 0) + 1
    for p_rank in range(n % 2, n + 1, 2):
        h = (n - p_rank) // 2
        d_np = math.comb(n, h) - (math.comb(n, h - 1) if h >= 1 else 0)
        assert hist.get(p_rank, 0) == d_np**2
    assert sum(hist.values()) == catalan(n)


def _closed_form(n, T, start):
    """The brick-wall closed forms (docs/noncrossing.md, "Tests"): (through, caps, cups) as sets."""
    ev = {(a, a + 1) for a in range(0, n - 1, 2)}  # (0,1),(2,3),...
    od = {(a, a + 1) for a in range(1, n - 1, 2)}  # (1,2),(3,4),...
    if n % 2 == 0 and start == "even":
        return set(), ev, (ev if T % 2 else od | {(0, n - 1)})
    if n % 2 == 0:
        if T == 1:
            return {(0, 0), (n - 1, n - 1)}, od, od
        wrap = od | {(0, n - 1)}
        return set(), wrap, (ev if T % 2 == 0 else wrap)
    if start == "even":
        return ({(n - 1, n - 1)}, ev, ev) if T % 2 else ({(n - 1, 0)}, ev, od)
    return ({(0, 0)}, od, od) if T % 2 else ({(0, n - 1)}, od, ev)


@pytest.mark.parametrize("n", range(4, 10))
@pytest.mark.parametrize("start", ["even", "odd"])
def test_brick_wall_closed_forms_and_period_two(n, start):
    diagrams = []
    for T in range(1, 7):
        p, _ = dn.word_to_diagram(dn.brick_wall_word(n, T, start), n)
        th, cp, cu = _closed_form(n, T, start)
        assert set(dn.through_strands(p)) == th
        assert set(dn.caps(p)) == cp and set(dn.cups(p)) == cu
        diagrams.append(tuple(p))
    for T in range(2, 5):
        assert diagrams[T - 1] == diagrams[T + 1]
    assert len(set(diagrams)) <= (3 if (start == "odd" and n % 2 == 0) else 2)


@pytest.mark.parametrize(
    "word, msg",
    [
        ([0, 3], "n-1"),
        ([0, -1], "negative"),
        (np.array([0.0, 1.0]), "integer dtype"),
        (np.zeros((2, 2), np.int32), "1-D"),
    ],
)
def test_invalid_words_raise(word, msg):
    with pytest.raises(ValueError, match=msg):
        dn.word_to_diagram(word, 4)
