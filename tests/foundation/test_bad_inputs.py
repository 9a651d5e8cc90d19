"""Bad input fails early with a ValueError naming the argument, its value and what is allowed.

Nothing here compiles an executor except the empty-batch test, which runs each implementation once at tiny size.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from sparse_attn import patterns as P

KEY = jax.random.PRNGKey(0)
SEG = jnp.zeros((1, 8), jnp.int32)


@pytest.mark.parametrize(
    "make, match",
    [
        # sequence length
        (lambda: P.dense(0), r"n \(sequence length\) must be an int >= 1, got 0"),
        (lambda: P.sliding_window(True, 1), r"n \(sequence length\) must be an int >= 1, got True"),
        (lambda: P.document_mask(jnp.zeros((1, 0), jnp.int32)), r"n \(sequence length\) must be an int >= 1, got 0"),
        # radius
        (lambda: P.sliding_window(8, 2.5), r"radius must be an int >= 0, got 2.5"),
        (lambda: P.sliding_window(8, -1), r"radius must be an int >= 0, got -1"),
        (lambda: P.sliding_window(8, True), r"radius must be an int >= 0, got True"),
        (lambda: P.longformer(8, 1.5, 1), r"radius must be an int >= 0, got 1.5"),
        (lambda: P.bigbird(16, -2, 1, 1, 4, KEY), r"radius must be an int >= 0, got -2"),
        (lambda: P.document_mask(SEG, radius=-1), r"radius must be None or an int >= 0, got -1"),
        (lambda: P.document_mask(SEG, radius=2.5), r"radius must be None or an int >= 0, got 2.5"),
        # valid_len
        (lambda: P.sliding_window(8, 1, valid_len=jnp.array([3.7])), r"valid_len must have an integer dtype.*float"),
        (lambda: P.dense(8, valid_len=[2.5]), r"valid_len must have an integer dtype.*float"),
        (lambda: P.dense(8, valid_len=jnp.array([True])), r"valid_len must have an integer dtype.*bool"),
        (lambda: P.document_mask(SEG, valid_len=jnp.array([2.5])), r"valid_len must have an integer dtype"),
        (lambda: P.dense(8, valid_len=np.array([2**32 + 3])), r"valid_len must lie in \[0, 8\]"),
        # global tokens
        (lambda: P.longformer(8, 1, 0), r"global_tokens .*must be an int in \[1, 8\].*got 0"),
        (lambda: P.longformer(8, 1, 9), r"global_tokens .*must be an int in \[1, 8\].*got 9"),
        (lambda: P.longformer(8, 1, 1.5), r"global_tokens .*must be an int in \[1, 8\].*got 1.5"),
        (lambda: P.longformer(8, 1, True), r"global_tokens .*must be an int in \[1, 8\].*got True"),
        (lambda: P.longformer(8, 1, jnp.zeros((1, 8), jnp.int32)), r"global_tokens must be an int or bool\[B\|1, 8\]"),
        # bigbird counts and block size
        (lambda: P.bigbird(16, 1, 1, 100, 4, KEY), r"num_random must be an int in \[0, 4\].*got 100"),
        (lambda: P.bigbird(16, 1, 1, -1, 4, KEY), r"num_random must be an int in \[0, 4\].*got -1"),
        (lambda: P.bigbird(16, 1, 1, 1.5, 4, KEY), r"num_random must be an int in \[0, 4\].*got 1.5"),
        (lambda: P.bigbird(16, 1, 1, 1, 0, KEY), r"block must be an int >= 1, got 0"),
        (lambda: P.bigbird(16, 1, 1, 1, 2.0, KEY), r"block must be an int >= 1, got 2.0"),
        (lambda: P.bigbird(16, 1, 1, 1, 4, KEY, batch=0), r"batch must be an int >= 1, got 0"),
        # batch axes that cannot broadcast against each other
        (lambda: P.bigbird(16, 1, 1, 1, 4, KEY, valid_len=[16, 16, 16], batch=2), r"batch=2.*valid_len.*3"),
        (lambda: P.longformer(8, 1, jnp.zeros((2, 8), bool), valid_len=[8, 8, 8]), r"global_tokens.*2.*valid_len.*3"),
        (lambda: P.document_mask(jnp.zeros((2, 8), jnp.int32), valid_len=[8, 8, 8]), r"segment_ids.*2.*valid_len.*3"),
        # statistics
        (lambda: P.pattern_stats(P.dense(8), 0), r"head_dim must be an int >= 1, got 0"),
        (lambda: P.pattern_stats(P.dense(8), 4, heads=0), r"heads must be an int >= 1, got 0"),
        (lambda: P.pattern_stats(P.dense(8, valid_len=[3, 4]), 4), r"batch axis 2, so batch must be 2; got 1"),
        (lambda: P.pattern_stats(P.dense(8, valid_len=[3, 4]), 4, batch=3), r"batch axis 2, so batch must be 2; got 3"),
    ],
)
def test_pattern_builders_reject_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_valid_len_dtype_is_checked_under_jit():
    with pytest.raises(ValueError, match="valid_len must have an integer dtype"):
        jax.jit(lambda vl: P.dense(8, valid_len=vl).lo)(jnp.array([3.5]))


def test_good_edge_values_still_build():
    assert P.bigbird(16, 1, 1, 4, 4, KEY).max_random == 4  # every key block may be drawn
    assert P.bigbird(16, 1, 1, 0, 32, KEY).block_q == 32  # one block longer than the sequence
    assert P.sliding_window(8, np.int64(100)).reach == (8, 8)
    assert P.longformer(8, 1, np.int32(8)).max_global == 8
    assert P.dense(8, valid_len=np.array([0, 8], np.int64)).valid_len.dtype == jnp.int32


def _qkv(b=1, n=8, h=2, g=2, d=4):
    return jnp.ones((b, n, h, d)), jnp.ones((b, n, g, d)), jnp.ones((b, n, g, d))


@pytest.mark.parametrize(
    "shapes, match",
    [
        (dict(d=0), r"head size D must be >= 1, got q shape \(1, 8, 2, 0\)"),
        (dict(h=0, g=1), r"query heads H must be >= 1"),
        (dict(g=0), r"KV heads G must be >= 1"),
    ],
)
def test_attention_rejects_empty_axes(shapes, match):
    q, k, v = _qkv(**shapes)
    with pytest.raises(ValueError, match=match):
        sa.attention(q, k, v, P.sliding_window(8, 1), implementation="reference")


@pytest.mark.parametrize("name", ["", "Reference", 0])
def test_attention_rejects_unknown_implementation_names(name):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"implementation must be None or one of \[.*'pallas'.*'reference'.*'xla'"):
        sa.attention(q, k, v, P.sliding_window(8, 1), implementation=name)


@pytest.mark.parametrize("implementation", ["reference", "xla", "pallas"])
@pytest.mark.parametrize("return_grad", [False, True])
def test_empty_batch_gives_empty_outputs(implementation, return_grad):
    q, k, v = _qkv(b=0)
    pattern = P.longformer(8, 1, 1)

    def f(q, k, v):
        out, lse = sa.attention(q, k, v, pattern, implementation=implementation, return_lse=True)
        return out, lse

    out, lse = f(q, k, v)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((0, 8, 2, 4), q.dtype, (0, 8, 2), jnp.float32)
    if return_grad:
        grads = jax.grad(lambda *a: f(*a)[0].sum(), argnums=(0, 1, 2))(q, k, v)
        assert [x.shape for x in grads] == [q.shape, k.shape, v.shape]


def test_empty_batch_still_checks_executor_options():
    q, k, v = _qkv(b=0)
    with pytest.raises(TypeError, match="interpret"):
        sa.attention(q, k, v, P.sliding_window(8, 1), implementation="pallas", interpret=True)
