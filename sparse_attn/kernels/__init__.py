"""Pallas block-sparse flash attention (Triton for GPU, Mosaic for TPU, interpret mode on CPU).

`sparse_attn.attention` registers `pallas_attention` as the "pallas" executor and picks it on GPU/TPU when
`implementation=None` (XLA stays the CPU default); `implementation="pallas"` on CPU runs the Triton kernels with
`interpret=True` (see `KernelConfig`).
"""

from sparse_attn.kernels.config import BlockSizes, KernelConfig
from sparse_attn.kernels.vjp import pallas_attention

__all__ = ["BlockSizes", "KernelConfig", "pallas_attention"]
