"""Layered construction, defect-pair layers, local-max selection, key rows, doubling (docs/noncrossing.md, "Tests")."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns.noncrossing import defect_pairs as dp
from sparse_attn.patterns.noncrossing import diagram_np as dn
from sparse_attn.patterns.noncrossing import key_rows as kr
from sparse_attn.patterns.noncrossing import layered, selection, stats
import tl_oracles


def _random_link_state(rng, n):
    """Random non-crossing caps with defects outside all caps: a random TL link state on n points."""
    d = dn.word_to_diagram(rng.integers(0, max(n - 1, 1), int(rng.integers(0, 3 * n))), n)[0] if n > 1 else None
    return [] if d is None else dn.caps(d)


def test_layered_word_gives_exactly_the_caps_with_depth_equal_nesting():
    rng = np.random.default_rng(10)
    for _ in range(200):
        n = int(rng.integers(1, 31))
        caps = _random_link_state(rng, n)
        layers = layered.layered_word(caps, n)
        word = [i for layer in layers for i in layer]
        for layer in layers:
            assert all(b - a >= 2 for a, b in itertools.pairwise(layer))  # independent set
        p, loops = dn.word_to_diagram(np.array(word, np.int64), n)
        assert sorted(dn.caps(p)) == sorted(caps) and loops == 0
        defects = sorted(set(range(n)) - {x for c in caps for x in c})
        assert dn.through_strands(p) == [(d, d) for d in defects]
        assert len(layers) == layered.nesting_depth(caps, n)


@pytest.mark.parametrize("n", range(2, 9))
def test_bfs_min_layers_equals_nesting_depth(n):
    layers_all = [
        s
        for r in range(1, n)
        for s in itertools.combinations(range(n - 1), r)
        if all(b - a >= 2 for a, b in itertools.pairwise(s))
    ]
    best = {tuple(dn.identity(n)): 0}
    frontier = [dn.identity(n)]
    depth = 0
    while frontier:
        depth += 1
        nxt = []
        for p in frontier:
            for s in layers_all:
                q = p.copy()
                for i in s:
                    dn.rmul_gen(q, i)
                if tuple(q) not in best:
                    best[tuple(q)] = depth
                    nxt.append(q)
        frontier = nxt
    min_depth_of_caps = {}
    for key, d in best.items():
        caps = tuple(dn.caps(np.array(key)))
        min_depth_of_caps[caps] = min(d, min_depth_of_caps.get(caps, d))
    assert len(best) == len(dn.all_diagrams(n))
    for caps, d in min_depth_of_caps.items():
        assert d == layered.nesting_depth(list(caps), n)


def test_local_max_is_independent_and_matches_definition():
    rng = np.random.default_rng(11)
    lmax = jax.jit(selection.local_max)
    topk = jax.jit(selection.top_k_independent, static_argnums=1)
    for _ in range(100):
        m = int(rng.choice([1, 2, 7, 19]))
        s = rng.integers(-3, 4, m).astype(np.float32)  # many ties
        sel = np.asarray(lmax(jnp.asarray(s)))
        for j in range(m):
            left = s[j - 1] if j > 0 else -np.inf
            right = s[j + 1] if j + 1 < m else -np.inf
            assert sel[j] == (s[j] > 0 and s[j] > left and s[j] >= right)
        assert not np.any(sel[1:] & sel[:-1])
        k = int(rng.choice([1, 3]))
        top = np.asarray(topk(jnp.asarray(s), k))
        assert np.all(sel[top]) and top.sum() == min(k, sel.sum())


def _host_defect_pair_layer(p, sel_top):
    """Independent host oracle: walk the chosen pairs' bottom ends and apply the generators one by one."""
    n = p.shape[0] // 2
    q = p.copy()
    defects = [a for a in range(n) if p[a] >= n]
    gens = []
    for j, d in enumerate(defects[:-1]):
        if sel_top[d]:
            gens += tl_oracles.pair_closing_generators(p, d, defects[j + 1])
    for i in sorted(gens):
        dn.rmul_gen(q, i)
    return q, sorted(gens)


def test_defect_pair_layer_from_arbitrary_diagrams():
    rng = np.random.default_rng(12)

    @jax.jit
    def layer(p0, c0, s):
        n = p0.shape[0] // 2
        out = dp.defect_pair_layer(p0, c0, s, n, 1)
        slow = dp.defect_pair_layer(p0, c0, s, n, 1, direct=False)  # general pointer-jumping TL kernel
        is_def, prv, nxt = dp.defects(p0)
        sel = selection.local_max_on_sequence(s, is_def & (nxt < n), prv, nxt)
        return out, slow, nxt, sel

    for _ in range(60):
        n = int(rng.choice([4, 13]))
        p0 = dn.word_to_diagram(rng.integers(0, n - 1, int(rng.integers(0, n))), n)[0]
        s = rng.normal(size=n).astype(np.float32)
        c0 = rng.integers(-1, n, 2 * n).astype(np.int32)  # arbitrary earlier creators must be carried over
        c0 = np.maximum(c0, c0[p0])  # both ends of an arc share one creator
        (p, c, loops, gs, ngen, npairs), slow, nxt, sel = layer(
            jnp.asarray(p0, jnp.int32), jnp.asarray(c0), jnp.asarray(s)
        )
        for a, b in zip((p, c, loops, gs, ngen, npairs), slow, strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        nxt, sel = np.asarray(nxt), np.asarray(sel)
        want, gens = _host_defect_pair_layer(p0, sel)
        assert np.array_equal(np.asarray(p), want) and int(ngen) == len(gens) and int(loops) == 0
        assert all(b - a >= 2 for a, b in itertools.pairwise(gens))
        chosen = {(a, int(nxt[a])) for a in range(n) if sel[a]}
        assert set(dn.caps(want)) == set(dn.caps(p0)) | chosen and int(npairs) == len(chosen)
        old_def = [a for a in range(n) if p0[a] >= n and a not in {x for c in chosen for x in c}]
        assert [a for a, _ in dn.through_strands(want)] == old_def
        gate = np.asarray(dp.creator_gate(c, jnp.concatenate([jnp.zeros(n), gs])))  # ids of layer 1 follow layer 0
        untouched = [
            x
            for x in range(2 * n)
            if x not in {y for cap in chosen for y in cap} and x >= 0 and not (x >= n and np.asarray(c)[x] >= n)
        ]
        assert np.array_equal(np.asarray(c)[untouched], c0[untouched])
        for a, _ in chosen:  # the cap's gate is log σ of the score of the pair that created it
            np.testing.assert_allclose(gate[a], np.asarray(jax.nn.log_sigmoid(s[a])), rtol=1e-6)


def test_defect_pair_diagram_builds_the_dyck_example_and_key_rows():
    n = 6  # (())(): layer 1 closes (1,2) and (4,5), layer 2 closes (0,3): the word e_1 e_4 | e_0 e_2
    table = jnp.array([[-1, 5, -1, -1, 5, -1], [5, -1, -1, -1, -1, -1]], jnp.float32)
    out = jax.jit(lambda tab: dp.defect_pair_diagram(lambda t, nxt: tab[t], n, 2))(table)
    want, _ = dn.word_to_diagram([1, 4, 0, 2], n)
    assert np.array_equal(np.asarray(out["p"]), want)
    assert int(out["word_length"]) == 4 and int(out["pairs"]) == 3 and int(out["loops"]) == 0
    default = {(0, 0), (0, 3), (1, 1), (1, 2), (2, 1), (2, 2), (3, 0), (3, 3), (4, 4), (4, 5), (5, 4), (5, 5)}
    for cup_slot, extra in ((False, set()), (True, {(0, 1), (1, 0), (2, 3), (3, 2)})):
        idx, valid, _ = kr.key_rows(out["p"], cup_slot=cup_slot)
        coo = {(a, int(idx[a, s])) for a in range(n) for s in range(idx.shape[1]) if valid[a, s]}
        assert coo == default | extra
    idx, valid, _ = kr.through_rows(out["p"])
    assert not np.any(np.asarray(valid))
    st = stats.diagram_stats(out["p"])
    assert int(st["rank"]) == 0 and int(st["caps"]) == 3 and int(st["nesting_depth"]) == 2


def _coo(p, cup_slot):
    n = p.shape[0] // 2
    e = {(a, a) for a in range(n)}
    e |= {(a, b) for a, b in dn.through_strands(p)}
    e |= {(a, b) for a, b in dn.caps(p)} | {(b, a) for a, b in dn.caps(p)}
    if cup_slot:
        e |= {(b, a) for a, b in dn.through_strands(p)}
        e |= {(a, b) for a, b in dn.cups(p)} | {(b, a) for a, b in dn.cups(p)}
    return e


def test_key_rows_equal_coo_definition_on_random_words():
    rng = np.random.default_rng(13)
    rows = jax.jit(kr.key_rows, static_argnames="cup_slot")
    for _ in range(60):
        n = int(rng.choice([3, 8, 15]))
        p = dn.word_to_diagram(rng.integers(0, n - 1, int(rng.integers(0, 2 * n))), n)[0]
        for cup_slot in (False, True):
            idx, valid, _ = rows(jnp.asarray(p, jnp.int32), cup_slot=cup_slot)
            idx, valid = np.asarray(idx), np.asarray(valid)
            listed = [(a, int(idx[a, s])) for a in range(n) for s in range(idx.shape[1]) if valid[a, s]]
            assert len(listed) == len(set(listed))  # duplicates masked
            assert set(listed) == _coo(p, cup_slot)
            assert np.all(valid[:, 0] & (idx[:, 0] == np.arange(n)))  # rows never empty


def test_mask_keys_padding_and_causal():
    idx = jnp.array([[0, 3, 1], [1, 2, 0], [2, 1, 3], [3, 0, 2]], jnp.int32)
    valid = jnp.ones((4, 3), bool)
    m = np.asarray(kr.mask_keys(idx, valid, 3))
    assert m.tolist() == [[True, False, True], [True, True, True], [True, True, False], [True, False, False]]
    m = np.asarray(kr.mask_keys(idx, valid, 4, causal=True))
    assert m.tolist() == [[True, False, False], [True, False, True], [True, True, False], [True, True, True]]


def test_doubling_embeds_random_motzkin_matchings():
    rng = np.random.default_rng(14)
    rows = jax.jit(kr.doubled_rows)
    for _ in range(150):
        n = int(rng.choice([1, 6, 13]))
        pairs, stack = [], []
        for t in range(n):  # random non-crossing partial matching
            r = rng.random()
            if r < 0.35:
                stack.append(t)
            elif r < 0.7 and stack:
                pairs.append((stack.pop(), t))
        caps = layered.doubled_caps(pairs, n)
        word = [i for layer in layered.layered_word(caps, 2 * n) for i in layer]
        p, _ = dn.word_to_diagram(np.array(word, np.int64), 2 * n)
        assert dn.is_valid(p) and sorted(dn.caps(p)) == caps and dn.rank(p) == 0
        assert layered.token_edges_doubled(p) == {(a, b) for a, b in pairs}
        idx, valid, _ = rows(jnp.asarray(p, jnp.int32))
        coo = {(t, int(idx[t, s])) for t in range(n) for s in range(3) if valid[t, s]}
        assert coo == {(t, t) for t in range(n)} | {(a, b) for a, b in pairs} | {(b, a) for a, b in pairs}


def test_doubling_rejects_crossing_pairs():
    with pytest.raises(ValueError, match="cross"):
        layered.doubled_caps([(0, 2), (1, 3)], 4)


def test_normal_form_length_stat_equals_shortest_word_length():
    rng = np.random.default_rng(15)
    shortest = {n: tl_oracles.bfs_shortlex(n) for n in range(2, 7)}
    for _ in range(30):
        n = int(rng.integers(2, 7))
        w = rng.integers(0, n - 1, int(rng.integers(0, 12)))
        p, _ = dn.word_to_diagram(w, n)
        assert stats.normal_form_length(p) == len(shortest[n][tuple(int(x) for x in p)])
