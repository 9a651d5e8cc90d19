"""JAX TL kernels equal the numpy oracle: scan, pointer-jumping layers, creators, loops, vmap, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns.noncrossing import diagram_jax as dj
from sparse_attn.patterns.noncrossing import diagram_np as dn
import tl_oracles


def test_scan_word_to_diagram_equals_numpy():
    rng = np.random.default_rng(6)
    f = jax.jit(dj.word_to_diagram, static_argnums=1)
    for n in (2, 3, 7, 12):
        for _ in range(15):
            w = rng.integers(0, n - 1, 16).astype(np.int32)
            p, loops = dn.word_to_diagram(w, n)
            pj, lj = f(jnp.asarray(w), n)
            assert np.array_equal(p, np.asarray(pj)) and loops == int(lj)


def test_scan_skips_padding():
    w = np.array([1, 2, 1, 0, 0], np.int32)
    valid = np.array([True, True, True, False, False])
    pj, lj = dj.word_to_diagram(jnp.asarray(w), 5, jnp.asarray(valid))
    p, loops = dn.word_to_diagram(w[:3], 5)
    assert np.array_equal(p, np.asarray(pj)) and loops == int(lj)


def test_pointer_jumping_layers_equal_sequential_with_loops_and_creators():
    rng = np.random.default_rng(7)
    layer = jax.jit(dj.apply_layer)
    for _ in range(40):
        n = int(rng.choice([2, 5, 13]))  # few sizes: one compile each
        sel = tl_oracles.independent_layers(rng, n, int(rng.integers(1, 6)))
        q, c, loops = dn.identity(n), -np.ones(2 * n, np.int64), 0
        qj, cj, lj = dj.identity(n), -jnp.ones(2 * n, jnp.int32), 0
        for t in range(sel.shape[0]):
            for i in np.nonzero(sel[t])[0]:  # increasing order: the creator convention of apply_layer
                loops += dn.rmul_gen(q, int(i), c, t * (n - 1) + int(i))
            ids = jnp.arange(n - 1, dtype=jnp.int32) + t * (n - 1)
            qj, cj, lt = layer(qj, jnp.asarray(sel[t]), cj, ids)
            lj += int(lt)
            assert np.array_equal(q, np.asarray(qj)) and np.array_equal(c, np.asarray(cj)) and loops == lj


def test_layers_to_diagram_equals_stack_oracle():
    rng = np.random.default_rng(8)
    to_diagram = jax.jit(dj.layers_to_diagram)
    for _ in range(30):
        n = int(rng.choice([2, 6, 11]))
        sel = tl_oracles.independent_layers(rng, n, 4)
        word = [int(i) for t in range(4) for i in np.nonzero(sel[t])[0]]
        p, loops = tl_oracles.stacked_word_diagram(word, n)
        pj, lj = to_diagram(jnp.asarray(sel))
        assert np.array_equal(p, np.asarray(pj)) and loops == int(lj)


def test_vmap_over_batch_of_words():
    rng = np.random.default_rng(9)
    n = 9
    w_BxT = rng.integers(0, n - 1, (6, 20)).astype(np.int32)
    p_Bx2N, loops_B = jax.vmap(lambda w: dj.word_to_diagram(w, n))(jnp.asarray(w_BxT))
    for b in range(6):
        p, loops = dn.word_to_diagram(w_BxT[b], n)
        assert np.array_equal(p, np.asarray(p_Bx2N[b])) and loops == int(loops_B[b])


@pytest.mark.parametrize(
    "word, msg",
    [
        (np.array([0, 3], np.int32), "n-1"),
        (np.array([-1], np.int32), "negative"),
        (np.array([0.0, 1.0], np.float32), "integer dtype"),
        (np.zeros((2, 2), np.int32), "1-D"),
    ],
)
def test_invalid_words_raise_before_tracing(word, msg):
    with pytest.raises(ValueError, match=msg):
        dj.word_to_diagram(jnp.asarray(word), 4)


def test_traced_word_rank_and_dtype_still_checked():
    with pytest.raises(ValueError, match="integer dtype"):
        jax.jit(lambda w: dj.word_to_diagram(w, 4))(jnp.zeros((3,), jnp.float32))
