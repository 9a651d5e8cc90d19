"""Registration, platform defaults, configuration and tile-list metadata (no kernel compiles except one)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.attention import attention, available_implementations, default_implementation
from sparse_attn.kernels import BlockSizes, KernelConfig, metadata
from sparse_attn.patterns.neighbours import NeighbourList
from tests.kernels import cases


def test_pallas_is_the_accelerator_default_and_xla_the_cpu_default():
    assert "pallas" in available_implementations()
    assert default_implementation("gpu") == "pallas"
    assert default_implementation("tpu") == "pallas"
    assert default_implementation("cpu") == "xla"


def test_explicit_pallas_on_cpu_runs_interpreted_triton_kernels():
    """Default config on CPU; D = 24 also exercises the head-size padding the Triton tiles need."""
    cfg = KernelConfig().resolve(24, platform="cpu")
    assert (cfg.backend, cfg.interpret) == ("triton", True)
    n, d = 128, 24
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (1, n, 2, d))
    k, v = (jax.random.normal(x, (1, n, 1, d)) for x in ks[1:])
    pattern = cases.make("window_causal", n)

    def value_and_grads(impl):
        loss = lambda q, k, v: jnp.sum(jnp.sin(attention(q, k, v, pattern, implementation=impl)))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)

    (got, got_g), (want, want_g) = value_and_grads("pallas"), value_and_grads("reference")
    np.testing.assert_allclose(float(got), float(want), rtol=5e-5)
    for g, w in zip(got_g, want_g, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=5e-5, rtol=5e-5)


def test_pallas_on_a_neighbour_list_is_an_error_naming_what_can_run():
    """No kernel for K <= 3 rows (docs/kernels.md): an explicit "pallas" fails; None picks the XLA gather."""
    n = 64
    q = k = v = jnp.zeros((1, n, 2, 16))
    idx = jnp.arange(n, dtype=jnp.int32)[:, None] - jnp.arange(3, dtype=jnp.int32)[None]
    nl = NeighbourList(jnp.maximum(idx, 0)[None, None], (idx >= 0)[None, None])
    with pytest.raises(ValueError, match=r"one of \['reference', 'xla'\].*NeighbourList"):
        attention(q, k, v, nl, implementation="pallas")
    assert default_implementation("gpu", NeighbourList) == "xla"


def test_platform_defaults():
    gpu = KernelConfig().resolve(128, platform="gpu")
    assert (gpu.backend, gpu.interpret) == ("triton", False)
    tpu = KernelConfig().resolve(128, platform="tpu")
    assert (tpu.backend, tpu.interpret) == ("mosaic", False)
    b = tpu.block_sizes
    assert all(x % 128 == 0 for x in (b.block_q, b.block_k) + b.bwd)
    assert 64 <= gpu.block_sizes.block_q <= 128 and 64 <= gpu.block_sizes.block_k <= 128
    with pytest.raises(dataclasses_error()):
        gpu.block_sizes.block_q = 64  # frozen


def dataclasses_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_config_validation():
    with pytest.raises(ValueError, match="power of two"):
        BlockSizes(block_q=96, block_k=64)
    with pytest.raises(ValueError, match="backend"):
        KernelConfig(backend="cuda")
    with pytest.raises(ValueError, match="backward"):
        KernelConfig(backward="autodiff")
    with pytest.raises(TypeError):
        BlockSizes(64, 64)  # keyword-only


@pytest.mark.parametrize(
    "kind,blocks", [("window", (64, 128)), ("longformer", (128, 64)), ("labels", (64, 64)), ("random_layout", None)]
)
def test_merged_lists_fit_their_capacity_and_keep_every_tile(kind, blocks):
    pattern = cases.make(kind)
    mask, rb, max_random, pinned = metadata.split_pattern(pattern)
    bq, bk = pinned or blocks
    lead = metadata.lead_shape(mask, rb)
    lists = metadata.tile_lists(mask, rb, max_random, lead, bq, bk)
    for transposed in (False, True):
        if transposed:
            parts = (lists.q_count, lists.q_idx, lists.q_rand, lists.full_q_count, lists.full_q_idx)
        else:
            parts = (lists.kv_count, lists.kv_idx, lists.kv_rand, lists.full_count, lists.full_idx)
        cap = metadata.capacity(mask, rb is not None, max_random, bq, bk, transposed)
        total = np.asarray(parts[0] + parts[3])
        assert total.max() <= cap
        count, idx, masked, _ = metadata.merged(*parts, cap)
        np.testing.assert_array_equal(np.asarray(count), total)
        count, idx, masked = (np.asarray(x) for x in (count, idx, masked))
        p_idx, p_cnt, f_idx = np.asarray(parts[1]), np.asarray(parts[0]), np.asarray(parts[4])
        for pos in np.ndindex(count.shape):
            c, cp = count[pos], p_cnt[pos]
            got = set(idx[pos][:c].tolist())
            want = set(p_idx[pos][:cp].tolist()) | set(f_idx[pos][: c - cp].tolist())
            assert got == want and len(got) == c  # every tile once
            assert (masked[pos][:cp] == 1).all() and (masked[pos][cp:c] == 0).all()
            if c:
                assert (idx[pos][c:] == idx[pos][c - 1]).all()  # padding re-reads the last tile


def test_token_metadata_marks_padding_and_globals():
    pattern = cases.make("longformer", 200)
    meta = metadata.token_meta(pattern, (cases.B, 1), 256)
    tok = np.asarray(meta.tok)
    assert tok.shape == (cases.B, 256)
    assert (tok[:, 200:] == 0).all()  # padded tokens: invalid
    assert (tok[0, 144:] & metadata.VALID == 0).all() and (tok[0, :144] & metadata.VALID).all()  # valid_len 144
    assert (tok[:, :3] & metadata.GLOBAL).all() and not (tok[:, 3:] & metadata.GLOBAL).any()
    lo, hi = np.asarray(meta.lo), np.asarray(meta.hi)
    assert (lo[..., 200:] > hi[..., 200:]).all()
    assert jnp.issubdtype(meta.lo.dtype, jnp.int32)
