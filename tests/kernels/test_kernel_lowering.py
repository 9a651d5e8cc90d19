"""The GPU (Triton) and TPU (Mosaic) kernels lower without the hardware, forward and backward, via jax.export."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from sparse_attn.executors.pallas import pallas_attention
from sparse_attn.kernels import BlockSizes, KernelConfig
from tests.kernels import cases

_TRITON_CALL = "__gpu$xla.gpu.triton"


def _export(kind: str, backend: str, d: int):
    n, b, h, g = 512, cases.B, cases.H, cases.G
    config = KernelConfig(backend=backend, interpret=False, block_sizes=BlockSizes.default(backend, d))
    # Random block lists at the 128-token granularity the TPU tiles need.
    pattern = cases.random_layout(n, 128, 4) if kind == "random_layout" else cases.make(kind, n)

    def loss_and_grads(q, k, v):
        def loss(q, k, v):
            out, lse = pallas_attention(q, k, v, pattern, d**-0.5, config=config)
            return jnp.sum(out.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    sds = jax.ShapeDtypeStruct
    args = (sds((b, n, h, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16))
    platform = "cuda" if backend == "triton" else "tpu"
    exported = jax.export.export(
        jax.jit(loss_and_grads),
        platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_TRITON_CALL)],
    )(*args)
    return exported.mlir_module()


# window_causal at d=64: two query heads per program (GQA sharing); labels: per-head lists.
@pytest.mark.parametrize("kind,d", [("labels", 64), ("random_layout", 128), ("window_causal", 64)])
def test_lowers_for_cuda(kind, d):
    module = _export(kind, "triton", d)
    assert module.count(_TRITON_CALL) == 3  # forward, dQ, dK/dV
    assert "tpu_custom_call" not in module


@pytest.mark.parametrize("kind,d", [("labels", 128), ("longformer", 64)])
def test_lowers_for_tpu(kind, d):
    module = _export(kind, "mosaic", d)
    assert module.count("tpu_custom_call") == 3
    assert _TRITON_CALL not in module


@pytest.mark.parametrize("backend,learned_bias", [("triton", False), ("triton", True), ("mosaic", False)])
def test_mask_and_score_functions_lower_on_the_kernels(backend, learned_bias):
    """A causal document mask from traced ids (stored partial tiles) with ALiBi and a softcap, plus on Triton a T5
    bias table (element gathers from a closed-over array): forward, dQ and dK/dV kernels; with the table
    differentiated, the forward kernel and the XLA backward."""
    from sparse_attn import score_fns as S
    from sparse_attn.executors.pallas import mask_fn_pallas_attention
    from sparse_attn.patterns import from_mask_fn
    from sparse_attn.patterns.mask_fns import and_masks, causal_mask, document_mask

    n, b, h, g, d = 512, 2, 4, 2, 64
    config = KernelConfig(backend=backend, interpret=False)

    def loss_and_grads(q, k, v, ids, table):
        pattern = from_mask_fn(and_masks(causal_mask, document_mask(ids)), n, n, batch=b, block_size=128,
                               capacity=4)  # fmt: skip

        def loss(q, k, v, table):
            score_fn = S.compose(S.alibi(S.alibi_slopes(h)), S.softcap(30.0))
            if learned_bias:
                score_fn = S.compose(S.relative_position_bias(table), score_fn)
            out, _ = mask_fn_pallas_attention(q, k, v, pattern, d**-0.5, config=config, score_fn=score_fn)
            return jnp.sum(out.astype(jnp.float32))

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3) if learned_bias else (0, 1, 2))(q, k, v, table)

    sds = jax.ShapeDtypeStruct
    args = (sds((b, n, h, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16),
            sds((b, n), jnp.int32), sds((h, 32), jnp.float32))  # fmt: skip
    platform = "cuda" if backend == "triton" else "tpu"
    module = jax.export.export(
        jax.jit(loss_and_grads), platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_TRITON_CALL)],
    )(*args).mlir_module()  # fmt: skip
    call = _TRITON_CALL if backend == "triton" else "tpu_custom_call"
    assert module.count(call) == (1 if learned_bias else 3)


def test_the_tpu_kernels_refuse_a_score_function_that_gathers_with_index_tiles():
    from sparse_attn import score_fns as S
    from sparse_attn.executors.pallas import mask_fn_pallas_attention
    from sparse_attn.patterns import from_mask_fn
    from sparse_attn.patterns.mask_fns import causal_mask

    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    config = KernelConfig(backend="mosaic", interpret=False)
    score_fn = S.relative_position_bias(jnp.zeros((2, 32)))
    run = lambda q: mask_fn_pallas_attention(q, q, q, from_mask_fn(causal_mask, 128, 128), 0.125,  # noqa: E731
                                             config=config, score_fn=score_fn)  # fmt: skip
    with pytest.raises(NotImplementedError, match="TPU"):
        jax.export.export(jax.jit(run), platforms=["tpu"])(x)
