"""The block-selection path (MoBA's gate -> selection -> `selected_attention` through "pallas", the layout NSA's
selected branch also runs) lowers for GPU (Triton) and TPU (Mosaic) without the hardware, forward and backward."""

import jax
import jax.numpy as jnp
import pytest

from sparse_attn.kernels import BlockSizes, KernelConfig
from sparse_attn.modules.moba import MobaAttentionConfig, moba_selection
from sparse_attn.modules.selected_blocks import selected_attention

_TRITON_CALL = "__gpu$xla.gpu.triton"


@pytest.mark.parametrize("backend, platform, tile, call", [("triton", "cuda", 64, _TRITON_CALL),
                                                           ("mosaic", "tpu", 128, "tpu_custom_call")])  # fmt: skip
def test_moba_lowers(backend, platform, tile, call):
    n, b, h, g, d = 512, 1, 4, 2, 64
    cfg = MobaAttentionConfig(block_size=128, top_k=3, tile=tile, causal=True, implementation="pallas")
    kernel = KernelConfig(backend=backend, interpret=False, block_sizes=BlockSizes(block_q=tile, block_k=tile))

    def loss_and_grads(q, k, v):
        def loss(q, k, v):
            sel = moba_selection(q, k, cfg, causal=True)
            o = selected_attention(q, k, v, sel, cfg.selection, causal=True, implementation="pallas", config=kernel)
            return jnp.sum(o.astype(jnp.float32))

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    sds = jax.ShapeDtypeStruct
    args = (sds((b, n, h, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16), sds((b, n, g, d), jnp.bfloat16))
    exported = jax.export.export(jax.jit(loss_and_grads), platforms=[platform],
                                 disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_TRITON_CALL)])(*args)
    assert exported.mlir_module().count(call) == 3  # forward, dQ, dK/dV
