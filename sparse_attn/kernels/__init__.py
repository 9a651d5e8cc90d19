"""Pallas block-sparse flash attention (Triton for GPU, Mosaic for TPU, interpret mode on CPU).

Importing this package registers the "pallas" executor as accelerated, so `attention(..., implementation=None)`
picks it on GPU/TPU (XLA stays the CPU default); `implementation="pallas"` on CPU runs the Triton kernels with
`interpret=True` (see `KernelConfig`).
"""

from sparse_attn.attention import register_executor
from sparse_attn.kernels.config import BlockSizes, KernelConfig
from sparse_attn.kernels.vjp import pallas_attention

register_executor("pallas", pallas_attention, accelerated=True)

__all__ = ["BlockSizes", "KernelConfig", "pallas_attention"]
