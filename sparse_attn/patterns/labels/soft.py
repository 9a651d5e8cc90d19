"""The soft shared-label score q_uv = 1 - Π_i (1 - p_ui p_vi) in stable log space."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRODUCT_CLIP = 1.0 - 1e-7  # keeps log1p(-x) finite when p_u p_v rounds to 1 in float32
DEFAULT_EPS = 1e-6


def sigmoid(x: jax.Array) -> jax.Array:
    """σ(x) as 0.5 (1 + tanh(x / 2)): no exp, so no overflow at small temperatures."""
    return 0.5 * (1.0 + jnp.tanh(0.5 * x))


def memberships(r_xL: jax.Array, tau) -> jax.Array:
    """p = σ(R / τ) in float32."""
    return sigmoid(r_xL.astype(jnp.float32) / tau)


def log_no_share(p_u_xL: jax.Array, p_v_xL: jax.Array) -> jax.Array:
    """L_uv = Σ_i log1p(-min(p_ui p_vi, 1 - 1e-7)) = log P(no shared label) <= 0; leading axes broadcast."""
    prod = jnp.minimum(p_u_xL * p_v_xL, PRODUCT_CLIP)
    return jnp.sum(jnp.log1p(-prod), axis=-1)


@jax.custom_vjp
def log_no_share_pairs(p_AxUxL: jax.Array, p_AxVxL: jax.Array) -> jax.Array:
    """[A, U, V]: `log_no_share` of every (u, v) pair of each of A groups — the soft executor's band layout.

    Same values as `log_no_share(p_u[:, :, None], p_v[:, None])`; the backward is two einsums. Autodiff of the
    broadcast form reduces a [A, U, V, L] product over a middle axis, which XLA:CPU runs far slower than the
    equivalent dot (docs/abca.md, "XLA:CPU detail"; docs/labels.md, "Train-step time and memory on CPU").
    """
    return log_no_share(p_AxUxL[:, :, None, :], p_AxVxL[:, None, :, :])


def _pairs_fwd(p_AxUxL, p_AxVxL):
    return log_no_share_pairs(p_AxUxL, p_AxVxL), (p_AxUxL, p_AxVxL)


def _pairs_bwd(res, g_AxUxV):
    p_u, p_v = res
    prod = p_u[:, :, None, :] * p_v[:, None, :, :]
    # d/dx log1p(-min(x, c)) = -1 / (1 - x) below the clip, 0 where the clip holds (as autodiff of jnp.minimum).
    t_AxUxVxL = jnp.where(prod < PRODUCT_CLIP, -g_AxUxV[..., None] / (1.0 - prod), 0.0)
    return jnp.einsum("auvl,avl->aul", t_AxUxVxL, p_v), jnp.einsum("auvl,aul->avl", t_AxUxVxL, p_u)


log_no_share_pairs.defvjp(_pairs_fwd, _pairs_bwd)


def log_q(p_u_xL: jax.Array, p_v_xL: jax.Array, eps: float = DEFAULT_EPS) -> jax.Array:
    """log(q_uv + eps) = log(-expm1(L_uv) + eps), finite in float32 where the direct formula gives -inf.

    The self pair is not special-cased here: callers set q_uu := 1 (bias 0).
    """
    return jnp.log(-jnp.expm1(log_no_share(p_u_xL, p_v_xL)) + eps)


def log_q_pairs(p_AxUxL: jax.Array, p_AxVxL: jax.Array, eps: float = DEFAULT_EPS) -> jax.Array:
    """[A, U, V]: `log_q` of every (u, v) pair of each group, through `log_no_share_pairs` (a fast backward)."""
    return jnp.log(-jnp.expm1(log_no_share_pairs(p_AxUxL, p_AxVxL)) + eps)


def q_direct(p_u_xL: jax.Array, p_v_xL: jax.Array) -> jax.Array:
    """1 - Π_i (1 - p_ui p_vi): the textbook form, for tests (loses precision when q is small)."""
    return 1.0 - jnp.prod(1.0 - p_u_xL * p_v_xL, axis=-1)


def q_self(p_u_xL: jax.Array) -> jax.Array:
    """P(S_u non-empty) = 1 - Π_i (1 - p_ui): what the formula with p_ui² misses (docs/labels.md)."""
    return 1.0 - jnp.prod(1.0 - p_u_xL, axis=-1)


def centred_memberships(r_xL: jax.Array, tau, top_k: int) -> jax.Array:
    """p = σ((R - θ) / τ), θ (held constant) halfway between each token's k-th and (k+1)-th largest logit.

    As τ -> 0 this tends to the top-k indicator the hard phase uses, so the soft pattern meets the hard one at the
    end of the anneal (σ(R/τ) instead tends to {i : R_i > 0}, any number of labels). See docs/labels.md.
    """
    r = r_xL.astype(jnp.float32)
    d = r.shape[-1]
    if top_k >= d:
        theta = jnp.min(r, axis=-1, keepdims=True) - 1.0
    else:
        top = jax.lax.top_k(r, top_k + 1)[0]
        theta = 0.5 * (top[..., top_k - 1 : top_k] + top[..., top_k : top_k + 1])
    return sigmoid((r - jax.lax.stop_gradient(theta)) / tau)
