"""Shared memory a Triton launch of the kernels in `flash_gpu` asks for: a calibrated model (docs/kernels.md,
"Shared memory").

Triton software-pipelines the tile loads of each `fori_loop` into `num_stages` shared-memory buffers, keeps the
tiles a program loads once (its query tiles in the forward and dQ, its key/value tiles in dK/dV) in shared memory,
and adds a little scratch for row reductions. Buffers of the masked and the full loop are not live at the same
time and share their space. Calibration: fp32, D = 64, 128 x 128 tiles, 3 stages, two query heads per program
(B=2, H=4, G=2 causal at n=512 on an H200) asked 263,680 B = 3 * (K + V) + 2 * Q + 1,536 B of row scratch, which
the model reproduces exactly; bf16 defaults at D = 64 and 128 compiled there.
"""

from __future__ import annotations

import dataclasses

# H100 / H200: the opt-in shared memory per thread block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
HOPPER_LIMIT = 232_448
# Defaults keep this fraction of the limit free: Triton's layout-conversion scratch is placed in buffers that are
# dead at that moment in the measured case, but need not be in every kernel.
MARGIN = 0.15
# Bytes of query tiles one forward/dQ program may hold for its query heads (a bf16 128 x 128 tile; for bf16 this
# is the accumulator budget of 128 * 128 fp32 elements that `flash_gpu` always had).
GROUP_TILE_BYTES = 128 * 128 * 2
_ROW_SCRATCH = 3 * 4  # bytes per tile row: the reductions' cross-warp scratch (calibration residue)


def max_group_heads(block_q: int, head_dim: int, itemsize: int) -> int:
    """Largest power of two rp of query heads per forward/dQ program with rp query tiles in `GROUP_TILE_BYTES`
    (fp32 inputs get half the heads of bf16: their tiles are twice as large)."""
    rp = 1
    while 2 * rp * block_q * head_dim * max(itemsize, 2) <= GROUP_TILE_BYTES:
        rp *= 2
    return rp


@dataclasses.dataclass(frozen=True)
class SmemBytes:
    """Modelled shared-memory bytes of the three launches."""

    forward: int
    dq: int
    dkdv: int

    def worst(self) -> int:
        return max(self.forward, self.dq, self.dkdv)


def forward_bytes(block_q: int, block_k: int, head_dim: int, itemsize: int, num_stages: int, heads: int = 1) -> int:
    """Forward: `num_stages` K and V tiles in the pipeline, `heads` resident query tiles, row scratch."""
    kv = 2 * block_k * head_dim * itemsize
    return num_stages * kv + heads * block_q * head_dim * itemsize + _ROW_SCRATCH * block_q


def dq_bytes(block_q: int, block_k: int, head_dim: int, itemsize: int, num_stages: int, heads: int = 1) -> int:
    """dQ: pipelined K and V tiles; resident Q and dO tiles and their lse/delta rows per query head."""
    kv = 2 * block_k * head_dim * itemsize
    resident = heads * (2 * block_q * head_dim * itemsize + 2 * block_q * 4)
    return num_stages * kv + resident + _ROW_SCRATCH * block_q


def dkdv_bytes(block_q: int, block_k: int, head_dim: int, itemsize: int, num_stages: int) -> int:
    """dK/dV: pipelined Q and dO tiles with their lse/delta rows; resident K and V tiles."""
    per_stage = 2 * block_q * head_dim * itemsize + 2 * block_q * 4
    return num_stages * per_stage + 2 * block_k * head_dim * itemsize + _ROW_SCRATCH * block_k


def launch_bytes(blocks, head_dim: int, itemsize: int, heads: int | None = None) -> SmemBytes:
    """The three launches of a `BlockSizes` at head size `head_dim` (padded as the wrapper pads it: a power of two
    >= 16) and input itemsize; `heads` query heads per forward/dQ program (None: the most `flash_gpu` may use)."""
    d = max(16, 1 << (head_dim - 1).bit_length())
    bq_b, bk_b = blocks.bwd
    st = blocks.num_stages
    hf = heads or max_group_heads(blocks.block_q, d, itemsize)
    hb = heads or max_group_heads(bq_b, d, itemsize)
    return SmemBytes(
        forward=forward_bytes(blocks.block_q, blocks.block_k, d, itemsize, st, hf),
        dq=dq_bytes(bq_b, bk_b, d, itemsize, st, hb),
        dkdv=dkdv_bytes(bq_b, bk_b, d, itemsize, st),
    )


def fits(blocks, head_dim: int, itemsize: int, limit: int = HOPPER_LIMIT, margin: float = MARGIN) -> bool:
    """Whether every launch stays under `limit * (1 - margin)`."""
    return launch_bytes(blocks, head_dim, itemsize).worst() <= limit * (1.0 - margin)
