"""The hard label pattern: allowed iff (u, v) ∈ E(H) and m_u & m_v != 0, plus self (docs/labels.md)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LabelPattern:
    """Label bitmasks over a base graph: label attention's own pattern type for `sparse_attn.attention`.

    Executors: "bucketed" (label buckets, log-sum-exp merge; needs `labels`), "xla" / "pallas" (the window
    `Intervals` carrying the bits, so the kernels' label-bit test runs; no landmarks), "reference".

    Attributes:
      bits: uint32[B|1, H|1, N, W] each token's labels (W = 1 for d <= 32, 2 for d <= 64).
      valid_len: int32[B|1] or None; tokens at or after it take no part.
      base: static `BaseGraph` (window radius, landmark stride, causal).
      labels: int32[B|1, H|1, N, k] or None: the k distinct labels `bits` packs (`from_labels`).
      num_labels: static d, with `labels`.
    """

    bits: jax.Array
    valid_len: jax.Array | None = None
    base: BaseGraph = dataclasses.field(default=BaseGraph(radius=0), metadata=dict(static=True))
    labels: jax.Array | None = None
    num_labels: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @classmethod
    def from_labels(cls, labels_BxPxNxK: jax.Array, num_labels: int, *, base: BaseGraph, valid_len=None):
        """The pattern of each token's k distinct labels in [0, num_labels) (P = 1 shared by heads, or H)."""
        labels = jnp.asarray(labels_BxPxNxK, jnp.int32)
        return cls(bits_lib.pack_labels(labels, num_labels), valid_len, base, labels, num_labels)

    @property
    def num_tokens(self) -> int:
        return self.bits.shape[2]

    def validate(self, batch: int | None = None, heads: int | None = None) -> LabelPattern:
        b = self.bits
        if b.dtype != jnp.uint32 or b.ndim != 4 or b.shape[3] not in (1, 2):
            raise ValueError(f"LabelPattern.bits must be uint32[B|1, H|1, N, 1|2], got {b.dtype}{b.shape}")
        common.check_lead("LabelPattern.bits", b.shape, batch, heads)
        if self.valid_len is not None:
            common.check_int("LabelPattern.valid_len", self.valid_len, 1)
            common.check_lead("LabelPattern.valid_len", self.valid_len.shape, batch, None)
        if self.labels is not None:
            lab = self.labels
            if lab.ndim != 4 or lab.shape[:3] != b.shape[:3] or self.num_labels is None:
                raise ValueError(
                    f"LabelPattern.labels must be int32{tuple(b.shape[:3]) + ('k',)} with num_labels, got "
                    f"{lab.dtype}{lab.shape}, num_labels={self.num_labels}"
                )
            bits_lib.check_labels(self.num_labels, lab.shape[3])
        return self

    def allowed(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool[B', H', Q, K] for q_pos int32[Q] and k_pos int32[K]."""
        bq = jnp.take(self.bits, q_pos, axis=2)[:, :, :, None]
        bk = jnp.take(self.bits, k_pos, axis=2)[:, :, None, :]
        qp, kp = q_pos[:, None], k_pos[None, :]
        vl = None if self.valid_len is None else self.valid_len.reshape(-1, 1, 1, 1)
        h = self.base.edges(qp[None, None], kp[None, None], vl)
        return h & (bits_lib.shares(bq, bk) | (qp == kp)[None, None])

    def to_dense(self) -> jax.Array:
        """bool[B|1, H|1, N, N]: the oracle mask."""
        pos = jnp.arange(self.num_tokens, dtype=jnp.int32)
        return self.allowed(pos, pos)

    def window(self):
        """The window clause as a foundation `Intervals` carrying the label bits (self and landmarks excluded)."""
        return self.base.window(self.num_tokens, self.valid_len, self.bits)
