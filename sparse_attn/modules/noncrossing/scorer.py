"""The router's pair scorer: a small MLP on two tokens' hidden states, per routing layer and head.

phi_{t,h}(x_a, x_b) = w_{t,h} · gelu(U_{t,h} x_a + V_{t,h} x_b + c_{t,h}) + beta_{t,h}. U x and V x are one matmul
over all tokens (model_dim -> 2·T·H·r); a pair then costs O(r), so scoring stays cheap next to attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class PairScorer(nnx.Module):
    """Parameters of the per-(layer, head) pair MLPs. ``sides`` > 0 adds a learned embedding per half-point side."""

    def __init__(
        self, model_dim: int, num_heads: int, num_layers: int, router_dim: int, *, sides: int = 0, rngs: nnx.Rngs
    ):
        self.num_heads, self.num_layers, self.router_dim = num_heads, num_layers, router_dim
        self.proj = nnx.Linear(
            model_dim,
            2 * num_layers * num_heads * router_dim,
            use_bias=False,
            kernel_init=nnx.initializers.lecun_normal(),
            rngs=rngs,
        )
        shape = (num_heads, num_layers, router_dim)
        self.c = nnx.Param(jnp.zeros(shape))
        self.w = nnx.Param(jax.random.normal(rngs.params(), shape) / jnp.sqrt(router_dim))
        self.beta = nnx.Param(jnp.zeros((num_heads, num_layers)))
        self.side = (
            nnx.Param(0.5 * jax.random.normal(rngs.params(), (2, sides, num_heads, num_layers, router_dim)))
            if sides
            else None
        )

    def features(self, x_BxNxD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(u, v): float32[B, H, N, T, r] left- and right-end features of every token."""
        b, n, _ = x_BxNxD.shape
        uv = self.proj(x_BxNxD).astype(jnp.float32).reshape(b, n, 2, self.num_heads, self.num_layers, self.router_dim)
        uv = uv.transpose(2, 0, 3, 1, 4, 5)
        return uv[0], uv[1]

    def half_point_features(self, x_BxNxD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(u, v): float32[B, H, 2N, T, r] for the doubled TL_{2n}: token t's halves 2t, 2t+1 plus a side embedding."""
        u, v = self.features(x_BxNxD)
        side = self.side[...]  # [2 (u/v), 2 (half), H, T, r]

        def split(f, s):  # [B, H, N, T, r] -> [B, H, N, 2, T, r] -> [B, H, 2N, T, r]
            f2 = f[:, :, :, None] + s.transpose(1, 0, 2, 3)[None, :, None]
            return f2.reshape(f.shape[:2] + (2 * f.shape[2],) + f.shape[3:])

        return split(u, side[0]), split(v, side[1])


def pair_scores(
    u_MxR: jax.Array, v_MxR: jax.Array, partner_M: jax.Array, w_R: jax.Array, c_R: jax.Array, beta: jax.Array
) -> jax.Array:
    """float32[M]: phi(point x, point partner_M[x]) for one layer and head."""
    h = jax.nn.gelu(u_MxR + v_MxR[partner_M] + c_R[None])
    return h @ w_R + beta
