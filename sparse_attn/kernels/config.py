"""Frozen, keyword-only kernel configuration with per-platform defaults."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from sparse_attn.kernels import smem

_BACKENDS = ("triton", "mosaic")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSizes:
    """Tile sizes. The forward and dQ kernels walk one layout (block_q x block_k); dK/dV walk its transpose.

    Attributes:
      block_q, block_k: forward tiles.
      block_q_bwd, block_k_bwd: backward tiles (None: the forward ones). A second layout is built when they differ;
        BlockLayout patterns with random blocks pin every tile to the layout's own block sizes.
      num_warps, num_stages: Triton launch parameters (ignored by Mosaic); num_warps None picks 4 for D <= 64, else 8.
    """

    block_q: int
    block_k: int
    block_q_bwd: int | None = None
    block_k_bwd: int | None = None
    num_warps: int | None = None
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
            b = getattr(self, name)
            if b is not None and (b < 8 or b & (b - 1)):
                raise ValueError(f"BlockSizes.{name} must be a power of two >= 8, got {b}")

    @property
    def bwd(self) -> tuple[int, int]:
        return (self.block_q_bwd or self.block_q, self.block_k_bwd or self.block_k)

    @classmethod
    def default(cls, backend: str, head_dim: int, dtype=None) -> BlockSizes:
        """Triton: FlexAttention's H100 bf16 tiles (128x128, 3 stages) for D <= 64, 128x64 above, 64x32 above 128;
        64x64 backward (register pressure of five tiles), 32x32 above D = 128. Tiles depend on D only (so metadata
        prepared without a dtype serves every dtype); pipeline stages drop, per dtype (None: bf16), until every
        launch fits the H100/H200 shared memory with margin (`smem.fits`: fp32 at D = 64 gets 2 stages, at
        D = 128 one). Mosaic: 128-multiples (lane width), 512-wide key tiles amortise the ~0.35 us per grid step."""
        if backend == "triton":
            if head_dim <= 64:
                blocks = cls(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3)
            elif head_dim <= 128:
                blocks = cls(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=8, num_stages=2)
            else:
                blocks = cls(block_q=64, block_k=32, block_q_bwd=32, block_k_bwd=32, num_warps=8, num_stages=2)
            itemsize = 2 if dtype is None else np.dtype(dtype).itemsize
            while not smem.fits(blocks, head_dim, itemsize):
                if blocks.num_stages == 1:
                    raise ValueError(f"no default Triton tiles fit shared memory at D={head_dim}, {np.dtype(dtype)}")
                blocks = dataclasses.replace(blocks, num_stages=blocks.num_stages - 1)
            return blocks
        if backend == "mosaic":
            return cls(block_q=128, block_k=512 if head_dim <= 128 else 256, block_q_bwd=128, block_k_bwd=128)
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """How the "pallas" executor runs.

    Attributes:
      block_sizes: None picks `BlockSizes.default(backend, D, dtype)`.
      backend: "triton" (GPU kernels) or "mosaic" (TPU kernels); None follows the platform, and CPU runs the Triton
        kernels in interpret mode.
      interpret: run the kernels with `interpret=True` (Pallas' HLO interpreter); None means True exactly on CPU.
      backward: "pallas" (dQ and dK/dV kernels) or "xla" (autodiff of the XLA block-gather executor; a reference).
    """

    block_sizes: BlockSizes | None = None
    backend: str | None = None
    interpret: bool | None = None
    backward: str = "pallas"

    def __post_init__(self):
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ValueError(f"KernelConfig.backend must be one of {_BACKENDS} or None, got {self.backend!r}")
        if self.backward not in ("pallas", "xla"):
            raise ValueError(f"KernelConfig.backward must be 'pallas' or 'xla', got {self.backward!r}")

    def resolve(self, head_dim: int, platform: str | None = None, dtype=None) -> KernelConfig:
        """Fills every None from the platform (default: JAX's default backend) and the inputs' dtype (None: bf16;
        it sets the Triton pipeline stages, never the tiles)."""
        platform = platform or jax.default_backend()
        backend = self.backend or ("mosaic" if platform == "tpu" else "triton")
        interpret = self.interpret if self.interpret is not None else platform == "cpu"
        blocks = self.block_sizes or BlockSizes.default(backend, head_dim, dtype)
        return dataclasses.replace(self, backend=backend, interpret=interpret, block_sizes=blocks)
