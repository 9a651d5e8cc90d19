"""Pallas block-sparse flash attention kernels (Triton for GPU, Mosaic for TPU, interpret mode on CPU).

Kernels only: per-token metadata and tile lists (`metadata`), the forward kernels (`flash_gpu`, `flash_tpu`), their
backward (`backward`) and their configuration (`KernelConfig`, `BlockSizes`). The executor that runs them for a
pattern (custom VJP, padding, global rows, registration as "pallas") is `sparse_attn.executors.pallas`, and label
attention's "bucketed_pallas" is `sparse_attn.executors.labels.pallas`: kernels sit below the executors and import
none of them (tests/test_layering.py).
"""

from sparse_attn.kernels.config import BlockSizes, KernelConfig

__all__ = ["BlockSizes", "KernelConfig"]
