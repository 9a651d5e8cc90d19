"""Independent numpy oracles for label attention (docs/labels.md definitions, float64), shared by the tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def base_graph(n: int, radius: int, landmark_every: int, causal: bool, valid_len: int | None = None) -> np.ndarray:
    """bool[N, N]: E(H) ∪ self from the docs/labels.md wording, written from scratch."""
    vl = n if valid_len is None else valid_len
    h = np.zeros((n, n), bool)
    for u in range(vl):
        for v in range(vl):
            near = (0 <= u - v <= radius) if causal else abs(u - v) <= radius
            landmark = landmark_every > 0 and v % landmark_every == 0 and (v <= u or not causal)
            h[u, v] = near or landmark or u == v
    return h


def hard_mask(z_NxL: np.ndarray, h_NxN: np.ndarray) -> np.ndarray:
    """bool[N, N]: in H and (Z Zᵀ > 0), plus self on H's diagonal."""
    share = (z_NxL.astype(np.int64) @ z_NxL.T.astype(np.int64)) > 0
    return h_NxN & (share | np.eye(len(h_NxN), dtype=bool))


def z_from_labels(labels_NxK: np.ndarray, num_labels: int) -> np.ndarray:
    z = np.zeros((labels_NxK.shape[0], num_labels), bool)
    np.put_along_axis(z, np.asarray(labels_NxK), True, axis=1)
    return z


def weights(q_NxD, k_NxD, mask_NxN, bias_NxN=None, scale=None):
    """float64 masked softmax weights [N, N]; rows with no key are 0."""
    q, k = (np.asarray(x, np.float64) for x in (q_NxD, k_NxD))
    s = q @ k.T * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if bias_NxN is not None:
        s = s + bias_NxN
    s = np.where(mask_NxN, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask_NxN, np.exp(s - m), 0.0)
    row_sum = e.sum(-1, keepdims=True)
    return np.where(row_sum > 0, e / np.where(row_sum > 0, row_sum, 1.0), 0.0)


def attention(q_NxD, k_NxD, v_NxD, mask_NxN, bias_NxN=None, scale=None):
    """float64 masked softmax attention; rows with no key give 0."""
    return weights(q_NxD, k_NxD, mask_NxN, bias_NxN, scale) @ np.asarray(v_NxD, np.float64)


def outputs_and_grads(ours, ref, q, k, v, ct):
    """((ours' outputs), grads), ((ref's outputs), grads) of <out, ct> + sum(finite lse), one jit per side.

    Each side runs to completion before the other is traced, so a crash in one program is reported at its own call
    (docs/training.md, "Known platform issues": a jaxlib CPU segfault once surfaced while `ref` was traced).
    """

    def with_grads(fn):
        def loss(q, k, v):
            res = fn(q, k, v)
            return jnp.sum(res[0] * ct) + jnp.sum(jnp.where(jnp.isfinite(res[1]), res[1], 0)), res

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    ours_fn, ref_fn = with_grads(ours), with_grads(ref)
    (_, res_ours), g_ours = jax.block_until_ready(ours_fn(q, k, v))
    (_, res_ref), g_ref = jax.block_until_ready(ref_fn(q, k, v))
    return (res_ours, g_ours), (res_ref, g_ref)
