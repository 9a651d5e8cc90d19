"""Pallas block-sparse flash attention (Triton for GPU, Mosaic for TPU, interpret mode on CPU).

Importing this package registers `pallas_attention` as the "pallas" executor of `Intervals` and `BlockLayout`,
the default on GPU/TPU (XLA stays the CPU default), with `prepare_pallas` (token metadata and tile lists built once
by `sparse_attn.prepare`); `implementation="pallas"` on CPU runs the Triton kernels with
`interpret=True` (see `KernelConfig`). Neighbour lists have no kernel (docs/kernels.md, "Decisions").
`kernels/labels.py` runs label attention's `LabelPattern` through the same kernels in bucket-entry space
("bucketed_pallas").
"""

from sparse_attn.executors.registry import register_executor
from sparse_attn.kernels import labels as _labels  # noqa: F401  registers LabelPattern's "bucketed_pallas"
from sparse_attn.kernels.config import BlockSizes, KernelConfig
from sparse_attn.kernels.vjp import pallas_attention, prepare_pallas
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals

register_executor(Intervals, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas)
register_executor(BlockLayout, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas)

__all__ = ["BlockSizes", "KernelConfig", "pallas_attention", "prepare_pallas"]
