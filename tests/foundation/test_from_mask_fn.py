"""patterns.from_mask_fn against a float64 numpy oracle written from the rules, not from the library: block
classification, outputs and gradients on every executor, cross-attention, GQA, padding, jit, bad input."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from experiments.gpu.measure import reference64
from sparse_attn.patterns import from_mask_fn
from sparse_attn.patterns import mask_fns as M
from sparse_attn.patterns.mask_pattern import EMPTY, FULL, PARTIAL

RNG = np.random.default_rng(0)


def numpy_blocks(mask_BxHxQxK, bq, bk):
    """EMPTY / PARTIAL / FULL per block from the dense mask (padding keys never allowed, padding rows ignored)."""
    b, h, nq, nk = mask_BxHxQxK.shape
    qb, kb = -(-nq // bq), -(-nk // bk)
    out = np.zeros((b, h, qb, kb), np.int8)
    for i in range(qb):
        for j in range(kb):
            tile = mask_BxHxQxK[:, :, i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
            whole = tile.shape[-1] == bk
            out[:, :, i, j] = np.where(tile.all((2, 3)) & whole, FULL, np.where(tile.any((2, 3)), PARTIAL, EMPTY))
    return out


# The ready-made predicates, each beside its rule in numpy: (mask_fn, batch, numpy rule(b, h, q, k) on grids).
N = 37
IDS = np.sort(RNG.integers(0, 4, (2, N)), axis=1).astype(np.int32)
PREFIX = np.array([5, 20], np.int32)
LENGTHS = np.array([N, 23], np.int32)
READY = {
    "causal": (M.causal_mask, None, lambda b, h, q, k: k <= q),
    "window": (M.sliding_window_mask(5), None, lambda b, h, q, k: abs(q - k) <= 5),
    "causal_window": (M.and_masks(M.causal_mask, M.sliding_window_mask(6)), None,
                      lambda b, h, q, k: (k <= q) & (q - k <= 6)),
    "document": (M.document_mask(IDS), 2, lambda b, h, q, k: IDS[b, q] == IDS[b, k]),
    "prefix_lm": (M.prefix_lm_mask(PREFIX), 2, lambda b, h, q, k: (k <= q) | (k < PREFIX[b])),
    "chunked": (M.chunked_mask(8), None, lambda b, h, q, k: q // 8 == k // 8),
    "dilated": (M.dilated_mask(3, 2), None, lambda b, h, q, k: ((q - k) % 3 == 0) & (abs(q - k) <= 6)),
    "padding_or_window": (M.or_masks(M.padding_mask(LENGTHS), M.sliding_window_mask(2)), 2,
                          lambda b, h, q, k: ((q < LENGTHS[b]) & (k < LENGTHS[b])) | (abs(q - k) <= 2)),
}  # fmt: skip


def numpy_mask(rule, batch, heads, nq, nk):
    b, h, q, k = np.ix_(np.arange(batch), np.arange(heads), np.arange(nq), np.arange(nk))
    return np.broadcast_to(rule(b, h, q, k), (batch, heads, nq, nk))


@pytest.mark.parametrize("exhaustive", [True, False], ids=["exhaustive", "intervals"])
@pytest.mark.parametrize("name", sorted(READY))
def test_ready_made_predicates_classify_blocks_as_the_numpy_rule(name, exhaustive):
    """Exhaustive: the numpy classification exactly. Interval bounds: sound (FULL and EMPTY only where numpy says
    so; an undecided block is PARTIAL) and exact on every ready-made predicate but the chunks' first block."""
    fn, batch, rule = READY[name]
    p = from_mask_fn(fn, N, N, batch=batch, block_size=8, exhaustive=exhaustive)
    want = numpy_mask(rule, batch or 1, 1, N, N)
    np.testing.assert_array_equal(np.asarray(p.to_dense()), want)
    exact = numpy_blocks(want, 8, 8)
    state = np.asarray(p.block_state)
    if exhaustive or name != "chunked":
        np.testing.assert_array_equal(state, exact)
    assert np.all((state != FULL) | (exact == FULL)) and np.all((state != EMPTY) | (exact == EMPTY))
    pos = jnp.arange(N).reshape(1, 1, 1, N)
    np.testing.assert_array_equal(np.asarray(p.allowed(pos, pos)[:, :, 0]), want)
    # the lists hold exactly the partial and full blocks, ascending
    for kind, count, idx in ((PARTIAL, p.kv_count, p.kv_idx), (FULL, p.full_count, p.full_idx)):
        for b in range(state.shape[0]):
            for i in range(state.shape[2]):
                got = np.asarray(idx[b, 0, i, : int(count[b, 0, i])])
                np.testing.assert_array_equal(got, np.flatnonzero(state[b, 0, i] == kind))


def test_interval_bounds_are_sound_on_random_predicates():
    """Random compositions of index arithmetic (+, -, *, //, %, abs, min, max, comparisons, logic, selects, reads of
    closed-over arrays) over odd block sizes and unequal lengths: no block is FULL or EMPTY unless the exhaustive
    classification says so; a predicate outside the rules (a float) falls back to the exhaustive one."""
    rng = np.random.default_rng(3)
    nq, nk = 45, 29
    table = jnp.asarray(rng.integers(-3, 4, (2, 64)), jnp.int32)
    terms = [
        lambda b, h, q, k: q - 2 * k + 3,
        lambda b, h, q, k: (q * 3) // 4 - k,
        lambda b, h, q, k: jnp.abs(q - k) % 5,
        lambda b, h, q, k: jnp.maximum(q, k) - jnp.minimum(q, 2 * k),
        lambda b, h, q, k: table[b, q] + table[h, k],
        lambda b, h, q, k: jnp.where(q > k, q - k, table[b, k]),
        lambda b, h, q, k: (-q) // 3 + k % 4,
    ]
    ops = [jnp.less, jnp.less_equal, jnp.equal, jnp.not_equal, jnp.greater]
    undecided = 0
    for trial in range(8):
        t1, t2 = (terms[i] for i in rng.choice(len(terms), 2, replace=False))
        o1, o2 = (ops[i] for i in rng.choice(len(ops), 2))
        c1, c2 = (int(c) for c in rng.integers(-6, 7, 2))
        join = jnp.logical_and if trial % 2 else jnp.logical_or

        def fn(b, h, q, k, t1=t1, t2=t2, o1=o1, o2=o2, c1=c1, c2=c2, join=join):
            return join(o1(t1(b, h, q, k), c1), ~o2(t2(b, h, q, k), c2))

        block = (int(rng.integers(3, 9)), int(rng.integers(3, 9)))
        got = np.asarray(from_mask_fn(fn, nq, nk, batch=2, heads=2, block_size=block).block_state)
        want = np.asarray(from_mask_fn(fn, nq, nk, batch=2, heads=2, block_size=block, exhaustive=True).block_state)
        assert np.all((got != FULL) | (want == FULL)) and np.all((got != EMPTY) | (want == EMPTY)), trial
        undecided += int(np.sum(got != want))
    assert undecided < 0.5 * got.size * 8  # decided most blocks
    floats = lambda b, h, q, k: q.astype(jnp.float32) * 0.5 >= k  # noqa: E731
    p = from_mask_fn(floats, nq, nk, block_size=8)
    np.testing.assert_array_equal(np.asarray(p.block_state), numpy_blocks(
        np.asarray(M.evaluate(floats, 1, 1, nq, nk)), 8, 8))


# Queries and keys of different lengths, GQA, a predicate over closed-over arrays that depends on b and h, rows
# and keys with nothing allowed.
NQ, NK, H, G, D = 21, 30, 4, 2, 8
TABLE = RNG.integers(0, 5, (2, NQ)).astype(np.int32)
KEYS = RNG.integers(0, 5, (H, NK)).astype(np.int32)
KEYS[:, 7] = 9  # key 7 matches no query: exactly zero gradient
TABLE[1, 4] = 9  # query 4 of row 1 matches no key: output 0


def random_fn(b, h, q_idx, kv_idx):
    table, keys = jnp.asarray(TABLE), jnp.asarray(KEYS)
    return ((table[b, q_idx] + keys[h, kv_idx]) % 3 != 0) & (table[b, q_idx] != 9) & (keys[h, kv_idx] != 9)


def random_rule(b, h, q, k):
    return ((TABLE[b, q] + KEYS[h, k]) % 3 != 0) & (TABLE[b, q] != 9) & (KEYS[h, k] != 9)


@pytest.mark.parametrize("impl,dtype", [("reference", "float32"), ("xla", "float32"), ("xla", "bfloat16")])
def test_outputs_and_gradients_match_the_float64_oracle(impl, dtype):
    p = from_mask_fn(random_fn, NQ, NK, batch=2, heads=H, block_size=(8, 8))
    ks = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(ks[0], (2, NQ, H, D), dtype)
    k, v = (jax.random.normal(x, (2, NK, G, D), dtype) for x in ks[1:3])
    do = jax.random.normal(ks[3], (2, NQ, H, D), dtype)
    out, vjp = jax.vjp(lambda q, k, v: sa.attention(q, k, v, p, implementation=impl), q, k, v)
    got = (out, *vjp(do))
    mask = numpy_mask(random_rule, 2, H, NQ, NK)
    want = reference64(q, k, v, do, mask, D**-0.5)
    tol = 1e-5 if dtype == "float32" else 4e-2
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=tol, rtol=tol, err_msg=name)
    assert np.all(np.asarray(got[0][1, 4]) == 0)  # no allowed key: 0, never NaN
    assert np.all(np.asarray(got[2][:, 7]) == 0) and np.all(np.asarray(got[3][:, 7]) == 0)  # masked key


def test_a_pattern_built_under_jit_from_traced_buffers_never_retraces():
    @jax.jit
    @chex.assert_max_traces(n=1)  # a second trace (new buffer values recompiling) fails here
    def run(ids, q, k, v):
        p = from_mask_fn(M.and_masks(M.causal_mask, M.document_mask(ids)), 16, 16, batch=1, block_size=8,
                         capacity=2)
        return sa.attention(q, k, v, p, implementation="xla")

    q = k = v = jax.random.normal(jax.random.key(0), (1, 16, 1, 8))
    ids = np.repeat(np.arange(4), 4)[None].astype(np.int32)
    for shift in range(3):
        docs = (ids + shift) // 2
        out = run(jnp.asarray(docs), q, k, v)
        mask = numpy_mask(lambda b, h, i, j, docs=docs: (j <= i) & (docs[b, i] == docs[b, j]), 1, 1, 16, 16)
        want = reference64(q, k, v, np.zeros((1, 16, 1, 8)), mask, 8**-0.5)[0]
        np.testing.assert_allclose(np.asarray(out), want, atol=1e-5)
    # a pattern passed to a jitted function: new buffer values, the same program
    f = jax.jit(lambda p: p.to_dense().sum())
    a = from_mask_fn(M.document_mask(ids), 16, 16, batch=1)
    b = from_mask_fn(M.document_mask(ids // 2), 16, 16, batch=1)
    assert int(f(a)) == 64 and int(f(b)) == 128 and f._cache_size() == 1


def test_a_capacity_too_small_is_refused_or_poisons_its_rows():
    fn = M.and_masks(M.causal_mask, M.sliding_window_mask(9))
    with pytest.raises(ValueError, match="exceed the list capacity"):
        sa.attention(*[jnp.ones((1, 32, 1, 8))] * 3, from_mask_fn(fn, 32, 32, block_size=8, capacity=1))
    out = jax.jit(lambda q: sa.attention(q, q, q, from_mask_fn(fn, 32, 32, block_size=8, capacity=1)))(
        jnp.ones((1, 32, 1, 8)))
    assert np.isnan(np.asarray(out[0, 16:])).all() and np.isfinite(np.asarray(out[0, :8])).all()


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="must return bool"):
        from_mask_fn(lambda b, h, q, k: q - k, 8, 8)
    with pytest.raises(ValueError, match="one bool per"):
        from_mask_fn(lambda b, h, q, k: jnp.arange(3) < q, 8, 8)
    with pytest.raises(ValueError, match="could not be traced"):
        from_mask_fn(lambda q, k: q >= k, 8, 8)
    with pytest.raises(ValueError, match="must be callable"):
        from_mask_fn("causal", 8, 8)
    with pytest.raises(ValueError, match="ids cover 8 queries"):
        from_mask_fn(M.document_mask(np.zeros((1, 8), np.int32)), 9, 9, batch=1)
    with pytest.raises(ValueError, match="pass batch=2"):
        from_mask_fn(M.prefix_lm_mask(np.array([1, 2], np.int32)), 8, 8)
    with pytest.raises(ValueError, match=r"block_size \(keys\)"):
        from_mask_fn(M.causal_mask, 8, 4, block_size=8)
    with pytest.raises(ValueError, match="must lie in"):
        from_mask_fn(M.padding_mask(np.array([9], np.int32)), 8, 8, batch=1)
    q = jnp.ones((1, 8, 1, 4))
    with pytest.raises(ValueError, match="pattern covers 12 keys"):
        sa.attention(q, q, q, from_mask_fn(M.causal_mask, 8, 12))
    with pytest.raises(ValueError, match="cross-attention takes a pattern built for"):
        sa.attention(q, jnp.ones((1, 12, 1, 4)), jnp.ones((1, 12, 1, 4)), sa.patterns.causal(8))
