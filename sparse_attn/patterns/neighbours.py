"""Neighbour lists (ELL): per query a padded row of key indices with a validity mask and optional bias."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NeighbourList:
    """Query i may attend key idx[i, s] for every slot s with valid[i, s] and 0 <= idx[i, s] < N.

    A slot whose index lies outside [0, N) is invalid in every executor (`slot_valid`), also under jit where
    `validate` cannot see the values (it raises on concrete arrays).

    Attributes:
      idx: int32[B|1, H|1, N, K] key indices; valid slots of one row must be distinct.
      valid: bool[B|1, H|1, N, K].
      bias: float32[B|1, H|1, N, K] added to the slot's logit (None: no bias). Differentiable.
    """

    idx: jax.Array
    valid: jax.Array
    bias: jax.Array | None = None

    @property
    def num_tokens(self) -> int:
        return self.idx.shape[2]

    @property
    def width(self) -> int:
        return self.idx.shape[3]

    def validate(self, batch: int | None = None, heads: int | None = None) -> NeighbourList:
        common.check_int("NeighbourList.idx", self.idx, 4)
        if self.valid.dtype != jnp.bool_ or self.valid.shape != self.idx.shape:
            raise ValueError(
                f"NeighbourList.valid must be bool{self.idx.shape}, got {self.valid.dtype}{self.valid.shape}"
            )
        if self.bias is not None and (
            self.bias.shape != self.idx.shape or not jnp.issubdtype(self.bias.dtype, jnp.floating)
        ):
            raise ValueError(f"NeighbourList.bias must be float{self.idx.shape}, got {self.bias.dtype}{self.bias.shape}")
        common.check_lead("NeighbourList.idx", self.idx.shape, batch, heads)
        if common.is_concrete(self.idx, self.valid):
            n = self.num_tokens
            idx, valid = common.host(self.idx), common.host(self.valid)
            if np.any(valid & ((idx < 0) | (idx >= n))):
                raise ValueError(f"NeighbourList.idx has a valid index outside [0, {n - 1}]")
            srt = np.sort(np.where(valid, idx, -1 - np.arange(self.width)), axis=-1)
            if np.any((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)):
                raise ValueError("NeighbourList: a row lists the same key twice in valid slots")
        return self

    def slot_valid(self) -> jax.Array:
        """bool[B|1, H|1, N, K]: `valid` and the index lies in [0, N) (gathers would clamp it otherwise)."""
        return self.valid & (self.idx >= 0) & (self.idx < self.num_tokens)

    def dense_bias(self) -> jax.Array:
        """float32[B|1, H|1, N, N]: the slot biases at their keys, -inf where not allowed."""
        n = self.num_tokens
        bias = jnp.zeros(self.idx.shape, jnp.float32) if self.bias is None else self.bias.astype(jnp.float32)
        keys = jnp.arange(n, dtype=self.idx.dtype).reshape(1, 1, 1, 1, n)
        onehot = (self.idx[..., None] == keys) & self.slot_valid()[..., None]
        hit = jnp.any(onehot, axis=-2)
        val = jnp.sum(jnp.where(onehot, bias[..., None], 0.0), axis=-2)
        return jnp.where(hit, val, -jnp.inf)

    def to_dense(self) -> jax.Array:
        """bool[B|1, H|1, N, N]: the oracle mask."""
        n = self.num_tokens
        keys = jnp.arange(n, dtype=self.idx.dtype).reshape(1, 1, 1, 1, n)
        onehot = (self.idx[..., None] == keys) & self.slot_valid()[..., None]
        return jnp.any(onehot, axis=-2)
