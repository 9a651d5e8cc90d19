"""The block-selection pattern builder (`patterns.block_select`): its `to_dense()` against a plain transcription of
the selection rule, its block lists, the executors against the reference on it, and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from sparse_attn.modules.moba import MobaAttentionConfig, moba_core, moba_selection
from sparse_attn.patterns.block_select import block_select, select_blocks, select_group

TOL = dict(out=1e-5, grad=5e-5)  # float32, as tests/foundation/test_executors.py


def rule(scores, n, top_k, block, group, *, causal, valid_len, sinks=0, recent=0):
    """bool[B, H, n, n], transcribed from the rule: each valid query group keeps its own block, the eligible sink
    blocks and the eligible blocks at most `recent` blocks from its own, then eligible blocks by descending score
    (NaN as -inf, ties to the lower index) up to top_k blocks; query i attends valid key j (j <= i when causal)
    of a kept block."""
    scores = np.asarray(scores, np.float64)
    vl = np.broadcast_to(np.asarray(valid_len), (max(scores.shape[0], len(valid_len)),))
    b_, h_ = len(vl), scores.shape[1]
    nkb = -(-n // block)
    out = np.zeros((b_, h_, n, n), bool)
    for b in range(b_):
        for h in range(h_):
            s = scores[min(b, scores.shape[0] - 1), h]
            for i in range(min(n, vl[b])):
                g, own = i // group, i // block
                if g * group >= vl[b]:
                    continue
                ok = [kb for kb in range(nkb) if kb * block < vl[b] and (kb < own if causal else kb != own)]
                forced = [own] + [kb for kb in ok if kb < sinks or abs(kb - own) <= recent]
                rest = sorted((kb for kb in ok if kb not in forced),
                              key=lambda kb: (-(s[g, kb] if not np.isnan(s[g, kb]) else -np.inf), kb))  # fmt: skip
                kept = set(forced + rest[: max(top_k - len(forced), 0)])
                for j in range(min(n, vl[b])):
                    out[b, h, i, j] = (j // block in kept) and (not causal or j <= i)
    return out


CASES = {  # n, top_k, block_size, query_block, tile, causal, valid_len, (sinks, recent), scores (B, H), int ties
    "causal_per_head_ties_sink": (37, 3, 8, 4, 2, True, [37, 21], 1, (2, 3), True),
    "causal_sink_and_recent": (45, 4, 5, 5, 5, True, [45, 31], (1, 2), (2, 2), True),
    "bidirectional_recent": (40, 4, 4, 4, 2, False, [40, 17], (0, 1), (1, 2), False),
    "bidirectional_k_at_least_blocks": (24, 9, 6, 6, 3, False, [24, 13], 0, (1, 1), False),
    "causal_nan_scores": (32, 2, 8, 8, 4, True, [32, 27], 0, (2, 2), False),
    "per_token": (20, 2, 5, 1, 1, True, [20, 14], 0, (1, 2), True),
    "bidirectional_sinks_ties": (30, 4, 4, 2, 2, False, [30, 9], 2, (2, 1), True),
}


def _case(name):
    n, k, bs, qb, tile, causal, vl, forced, (b, h), ties = CASES[name]
    sinks, recent = forced if isinstance(forced, tuple) else (forced, 0)
    rng = np.random.default_rng(len(name))
    shape = (b, h, -(-n // qb), -(-n // bs))
    scores = rng.integers(0, 3, shape).astype(np.float32) if ties else rng.normal(size=shape).astype(np.float32)
    if name == "causal_nan_scores":
        scores[..., 1] = np.nan
    kw = dict(query_block=qb, tile=tile, causal=causal, valid_len=jnp.asarray(vl, jnp.int32), sink_blocks=sinks,
              recent_blocks=recent)
    return (n, k, bs, qb, causal, vl, sinks, recent), scores, kw


@pytest.mark.parametrize("name", sorted(CASES))
def test_to_dense_is_the_selection_rule(name):
    (n, k, bs, qb, causal, vl, sinks, recent), scores, kw = _case(name)
    vl_arr = kw.pop("valid_len")
    layout = jax.jit(lambda s, v: block_select(s, n, k, bs, valid_len=v, **kw))(jnp.asarray(scores), vl_arr)
    want = rule(scores, n, k, bs, qb, causal=causal, valid_len=vl, sinks=sinks, recent=recent)
    np.testing.assert_array_equal(np.asarray(layout.to_dense()), want)
    assert layout.block_q == layout.block_k == kw["tile"] and int(layout.overflow) == 0
    assert layout.max_random == min(k - 1, -(-n // bs) - 1) * bs // kw["tile"]  # never more blocks than exist
    _check_lists(layout, want)


def _check_lists(layout, dense):
    """Every tile holding an allowed pair is in its query tile's partial or full list, a full tile is allowed whole,
    and the key-major lists are the transposes of the query-major ones."""
    t, n = layout.block_q, dense.shape[-1]
    nt = -(-n // t)
    pad = np.zeros(dense.shape[:2] + (nt * t, nt * t), bool)
    pad[..., :n, :n] = dense
    tiles = pad.reshape(dense.shape[:2] + (nt, t, nt, t))
    any_, all_ = tiles.any((3, 5)), tiles.all((3, 5))
    lead = dense.shape[:2]

    def listed(count, idx):
        count, idx = np.broadcast_to(count, lead + count.shape[2:]), np.broadcast_to(idx, lead + idx.shape[2:])
        out = np.zeros(lead + (nt, nt), bool)
        for b, h, r in np.ndindex(*lead, nt):
            out[b, h, r, idx[b, h, r, : count[b, h, r]]] = True
        return out

    part, full = listed(layout.kv_count, layout.kv_idx), listed(layout.full_count, layout.full_idx)
    assert not (part & full).any() and not (any_ & ~(part | full)).any()
    assert not (full & ~all_[..., : nt, : nt]).any()
    np.testing.assert_array_equal(listed(layout.q_count, layout.q_idx), np.swapaxes(part, -1, -2))
    np.testing.assert_array_equal(listed(layout.full_q_count, layout.full_q_idx), np.swapaxes(full, -1, -2))


def test_builder_runs_eagerly_and_under_vmap():
    (n, k, bs, qb, causal, vl, _, _), scores, kw = _case("causal_per_head_ties_sink")
    eager = block_select(jnp.asarray(scores), n, k, bs, **kw).to_dense()
    vl_arr = kw.pop("valid_len")
    one = lambda s, v: block_select(s[None], n, k, bs, valid_len=v[None], **kw).to_dense()[0]  # noqa: E731
    mapped = jax.jit(jax.vmap(one))(jnp.asarray(scores), vl_arr)
    np.testing.assert_array_equal(np.asarray(mapped), np.asarray(eager))


# -- executors on the layout ------------------------------------------------------------------------------------

B, N, H, G, D, VL = 2, 32, 2, 1, 8, 21


def _inputs():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (B, N, H, D))
    k, v = (jax.random.normal(x, (B, N, G, D)) for x in ks[1:3])
    return q, k, v, jax.random.normal(ks[3], (B, N, H, D))


def _layout(heads):
    scores = jax.random.normal(jax.random.PRNGKey(7), (B, heads, N // 8, N // 8))
    build = jax.jit(lambda s, v: block_select(s, N, 2, 8, tile=4, causal=True, valid_len=v))
    return build(scores, jnp.array([N, VL]))


_RUNS = {}


def _run(impl, heads):
    """jit(out, grads) of loss = sum(out * ct) for one layout; one compilation per (impl, heads)."""
    if (impl, heads) not in _RUNS:
        layout = _layout(heads)

        def loss(q, k, v, ct):
            out = sa.attention(q, k, v, layout, implementation=impl)
            return jnp.sum(out * ct), out

        _RUNS[impl, heads] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    return _RUNS[impl, heads]


def _poisoned(q, k, v):
    """NaN at every padded position of batch 1 (the rows and keys no valid row may attend)."""
    return tuple(x.at[1, VL:].set(jnp.nan) for x in (q, k, v))


def test_xla_refuses_per_head_random_blocks():
    """The XLA executor shares random blocks across heads; a per-head selection is refused, never run with head
    0's blocks (the MoBA module folds heads into the batch for it)."""
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="per-head random blocks"):
        sa.attention(q, k, v, _layout(H), implementation="xla")


@pytest.mark.parametrize("impl,heads", [("xla", 1), ("pallas", 1), ("pallas", H)])
def test_executor_matches_reference(impl, heads):
    q, k, v, ct = _inputs()
    (_, want), want_g = _run("reference", heads)(q, k, v, ct)
    (_, got), got_g = _run(impl, heads)(q, k, v, ct)
    np.testing.assert_allclose(got, want, atol=TOL["out"], rtol=TOL["out"])
    for a, c in zip(got_g, want_g, strict=True):
        np.testing.assert_allclose(a, c, atol=TOL["grad"], rtol=TOL["grad"])
    # Padded rows output exactly 0; padded keys get exactly zero gradient; NaN there changes no valid row.
    assert not np.asarray(got[1, VL:]).any()
    for grad in got_g:
        assert not np.asarray(grad[1, VL:]).any()
    (_, dirty), dirty_g = _run(impl, heads)(*_poisoned(q, k, v), ct)
    np.testing.assert_array_equal(dirty[:, :VL], got[:, :VL])
    np.testing.assert_array_equal(dirty[0], got[0])
    for a, c in zip(dirty_g, got_g, strict=True):
        np.testing.assert_array_equal(a[:, :VL], c[:, :VL])


# -- errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=0), "top_k"),
        (dict(top_k=2, sink_blocks=2), "sink_blocks"),
        (dict(top_k=3, sink_blocks=1, recent_blocks=2), "recent_blocks"),
        (dict(recent_blocks=-1), "recent_blocks"),
        (dict(tile=3), "tile"),
        (dict(query_block=3), "query_block"),
        (dict(block_size=0), "block_size"),
        (dict(n=0), "n \\(sequence length\\)"),
        (dict(scores=jnp.zeros((1, 1, 3, 4))), "scores must be float"),
        (dict(valid_len=jnp.array([40])), "valid_len"),
    ],
)
def test_bad_arguments_fail_before_tracing(kwargs, match):
    args = dict(scores=jnp.zeros((1, 1, 4, 4)), n=32, top_k=2, block_size=8, tile=4)
    args.update(kwargs)
    scores = args.pop("scores")
    with pytest.raises(ValueError, match=match):
        block_select(scores, args.pop("n"), args.pop("top_k"), args.pop("block_size"), **args)


@pytest.mark.parametrize("sinks, recent", [(0, 0), (1, 1)])
def test_select_group_is_a_row_of_select_blocks(sinks, recent):
    """The decoders' one-group selection equals the full selection's row of that group (causal, full length)."""
    n, k, bs, qb = 29, 4, 4, 2
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 3, (2, 3, -(-n // qb), -(-n // bs))).astype(np.float32)  # ties
    full = np.asarray(select_blocks(scores, n, k, bs, query_block=qb, causal=True, sink_blocks=sinks,
                                    recent_blocks=recent))  # fmt: skip
    one = jax.jit(lambda s, q0: select_group(s, q0, k, bs, sink_blocks=sinks, recent_blocks=recent))
    for g in range(scores.shape[2]):
        np.testing.assert_array_equal(np.asarray(one(scores[:, :, g], g * qb)), full[:, :, g], err_msg=f"group {g}")


@pytest.mark.parametrize("impl", ["xla", "reference"])
def test_a_top_k_past_the_blocks_keeps_every_block(impl):
    """MoBA with top_k >= the key blocks of a short sequence (a model run on a short prompt): every block kept,
    so it equals causal dense attention (it used to fail in the "xla" executor on a too-wide random list)."""

    n = 40
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (2, n, 4, 8))
    k, v = (jax.random.normal(x, (2, n, 2, 8)) for x in ks[1:])
    vl = jnp.array([n, 33])
    want = sa.attention(q, k, v, sa.patterns.causal(n, valid_len=vl), implementation="reference")
    for top_k in (5, 9, 50):  # 5 blocks of 8
        cfg = MobaAttentionConfig(block_size=8, top_k=top_k, implementation=impl)
        sel = moba_selection(q, k, cfg, causal=True, valid_len=vl)
        got = moba_core(q, k, v, sel, cfg, causal=True, valid_len=vl)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
