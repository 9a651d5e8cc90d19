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
