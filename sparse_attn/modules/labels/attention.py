"""LabelAttention (NNX): routing head -> memberships -> soft / straight-through / hard label attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from typing import TYPE_CHECKING

from flax import nnx

from sparse_attn.executors.labels.bucketed import bucketed_attention, default_reach
from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.labels.router import LabelRouter
from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import losses, schedule, soft
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.buckets import bucket_sizes
from sparse_attn.patterns.labels.stats import label_stats

if TYPE_CHECKING:  # the config builds this module (`make`), so the module imports it for annotations only
    from sparse_attn.modules.labels.config import LabelAttentionConfig


def label_core(q, k, v, r_BxPxNxL, cfg: LabelAttentionConfig, base: BaseGraph, *, step, valid_len):
    """Attention core from routing logits and projected q, k, v: (out [B, N, H, D], keys [B, P, N], overflow, p).

    The phase follows `cfg.phase` (or the step, under "schedule": one `lax.switch`, so a jitted train step never
    recompiles when the phase changes). `overflow`: the hard phase's bucket entries whose range exceeded the reach
    planned from `cfg.reach_factor`; they ran a wider band tier, so the result is exact (statistic
    `capacity_overflow`; 0 in the soft phases).
    """
    n = q.shape[1]
    tau = schedule.temperature(step, tau_start=cfg.tau_start, tau_end=cfg.tau_end, anneal_steps=cfg.anneal_steps)
    p = soft.memberships(r_BxPxNxL, tau)
    labels = bits_lib.top_k_labels(jax.lax.stop_gradient(r_BxPxNxL), cfg.top_k)
    bits = bits_lib.pack_labels(labels, cfg.num_labels)

    def soft_like(mode):
        def run():
            o, _, keys = soft_label_attention(
                q, k, v, p, bits, base=base, mode=mode, eps=cfg.eps, valid_len=valid_len, block=cfg.soft_block
            )
            return o, keys, jnp.int32(0)

        return run

    def hard():
        reach = default_reach(n, base, cfg.num_labels, cfg.top_k, cfg.reach_factor)
        o, _, info = bucketed_attention(
            q, k, v, labels, num_labels=cfg.num_labels, base=base, valid_len=valid_len, block=cfg.block, reach=reach
        )
        return o, info["keys"], info["overflow"].astype(jnp.int32)

    branches = (soft_like("soft"), soft_like("straight_through"), hard)
    if cfg.phase == "schedule":
        idx = schedule.phase(step, soft_steps=cfg.soft_steps, straight_through_steps=cfg.straight_through_steps)
        o, keys, overflow = jax.lax.switch(idx, branches)
    else:
        o, keys, overflow = branches[schedule.PHASES[cfg.phase]]()
    return o, keys, overflow, p, labels, tau


class LabelAttention(nnx.Module):
    """Projections -> routing head -> label attention -> output projection, with router losses and statistics."""

    def __init__(self, config: LabelAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        label_heads = num_heads if config.per_head_labels else 1
        self.router = LabelRouter(model_dim, config.router_hidden, config.num_labels, label_heads, rngs=rngs)

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        cfg = self.config
        b = x_BxNxD.shape[0]
        valid_len = jnp.broadcast_to(jnp.asarray(ctx.valid_len, jnp.int32), (b,))
        base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmark_every, causal=ctx.causal)
        # Padded hidden states may hold anything (NaN included): select them away once, so that neither the
        # projections' and the router's weight gradients (x^T dq) nor the router losses ever multiply them.
        live = jnp.arange(x_BxNxD.shape[1])[None, :, None] < valid_len[:, None, None]
        x_BxNxD = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
        q, k, v = self.proj.qkv(x_BxNxD)
        r = self.router(x_BxNxD)
        o, keys, overflow, p, labels, tau = label_core(q, k, v, r, cfg, base, step=ctx.step, valid_len=valid_len)

        hard_sizes = jax.vmap(jax.vmap(lambda lab, vl: bucket_sizes(lab, cfg.num_labels, vl), (0, None)))(
            labels, valid_len
        )
        soft_sizes = losses.soft_sizes(p, valid_len)
        aux = {"label_sparsity": cfg.sparsity_weight * losses.sparsity(p, valid_len)}
        if cfg.balance == "cv2":
            aux["label_balance"] = cfg.balance_weight * losses.cv2(soft_sizes)
        elif cfg.balance == "switch":
            aux["label_balance"] = cfg.balance_weight * losses.switch(hard_sizes, soft_sizes)
        if cfg.z_loss_weight:
            aux["label_z_loss"] = cfg.z_loss_weight * losses.z_loss(r, valid_len)

        stats = label_stats(
            jax.lax.stop_gradient(keys),
            hard_sizes,
            heads=q.shape[2],
            head_dim=q.shape[3],
            causal=ctx.causal,
            valid_len=valid_len,
            overflow=overflow,
        )
        stats = {name: jax.lax.stop_gradient(val) for name, val in stats.items()}
        stats["tau"] = jax.lax.stop_gradient(tau)
        return AttentionOutput(y=self.proj.out(o), aux_losses=aux, stats=stats)
