"""A dense additive logit bias as a pattern: the exact form of an arbitrary dense mask or bias."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DenseBias:
    """A dense additive logit bias as a pattern: query i may attend key j iff bias[..., i, j] is not -inf.

    What `sparse_attn.make_attention_fn` runs when a caller's mask, bias or `is_causal` must be intersected with the pattern
    exactly: O(N^2) memory per (batch|1, head|1), run by the dense oracle "reference" only.

    Attributes:
      bias: float32[B|1, H|1, Nq, Nk], -inf where not allowed. Differentiable.
    """

    bias: jax.Array

    @property
    def num_tokens(self) -> int:
        return self.bias.shape[-2]

    @property
    def num_kv_tokens(self) -> int:
        return self.bias.shape[-1]

    def validate(self, batch: int | None = None, heads: int | None = None) -> DenseBias:
        b = self.bias
        if b.ndim != 4 or not jnp.issubdtype(b.dtype, jnp.floating):
            raise ValueError(f"DenseBias.bias must be float[B|1, H|1, Nq, Nk], got {b.dtype}{b.shape}")
        common.check_lead("DenseBias.bias", b.shape, batch, heads)
        return self

    def dense_bias(self) -> jax.Array:
        return self.bias.astype(jnp.float32)

    def to_dense(self) -> jax.Array:
        return ~jnp.isneginf(self.bias)

