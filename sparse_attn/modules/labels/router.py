"""The routing head R = MLP(x) ∈ R^{N × d} (per layer, optionally per head)."""

from __future__ import annotations

import jax
from flax import nnx


class LabelRouter(nnx.Module):
    """x [B, N, model_dim] -> R [B, P, N, d] with P = 1 or num_heads label heads."""

    def __init__(self, model_dim: int, hidden: int, num_labels: int, label_heads: int, *, rngs: nnx.Rngs):
        self.num_labels, self.label_heads = num_labels, label_heads
        self.hidden = nnx.Linear(model_dim, hidden, rngs=rngs)
        # Unit-scale logits at init so σ(R/τ) starts spread, not saturated.
        self.out = nnx.Linear(hidden, label_heads * num_labels, kernel_init=nnx.initializers.lecun_normal(), rngs=rngs)

    def __call__(self, x_BxNxD: jax.Array) -> jax.Array:
        b, n, _ = x_BxNxD.shape
        r = self.out(nnx.gelu(self.hidden(x_BxNxD)))
        return r.reshape(b, n, self.label_heads, self.num_labels).transpose(0, 2, 1, 3)
