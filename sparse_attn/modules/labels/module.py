"""LabelAttention (NNX): projections -> routing head -> label attention core -> output projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.labels.config import LabelAttentionConfig
from sparse_attn.modules.labels.core import label_core, planned_reach
from sparse_attn.modules.labels.router import LabelRouter
from sparse_attn.modules.labels.stats import label_stats
from sparse_attn.patterns.labels import losses, schedule
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.buckets import bucket_sizes
from sparse_attn.patterns.labels.schedule import DEFAULT_NUM_STEPS


class LabelAttention(nnx.Module):
    """Projections -> routing head -> label attention -> output projection, with router losses and statistics.

    The phase follows `ctx.step` through the config's schedule, scaled to `num_steps` (the schedule's, or the one
    `fit_schedule` sets). `ctx.step = None` or any step >= `num_steps` (e.g. `schedule.INFERENCE_STEP`) is the hard
    phase at the final temperature: inference.
    """

    def __init__(self, config: LabelAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.num_steps = config.schedule.num_steps
        # The planned hard-phase band (None: the config's default); `calibrate_reach` sets it.
        self.reach = config.capacity.reach
        self.capture_needed = False  # `calibrate_reach`: sow the reach each hard forward needed
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        label_heads = num_heads if config.router.per_head else 1
        self.router = LabelRouter(model_dim, config.router.hidden, config.num_labels, label_heads, rngs=rngs)

    def fit_schedule(self, run_steps: int) -> list[str]:
        """Scale the phase schedule to a run of `run_steps` (unless the schedule fixes `num_steps`).

        Returns why the schedule does not fit the run (phases given no step or not reached), for the caller to warn.
        """
        if self.config.schedule.num_steps is None:
            self.num_steps = int(run_steps)
        if self.config.phase != "schedule":
            return []
        return self.phase_steps().cut_short(run_steps, self.config.schedule.fractions)

    def phase_steps(self) -> schedule.Schedule:
        """The phase lengths in use: for `num_steps`, or `DEFAULT_NUM_STEPS` when neither the config nor a train
        loop gave a run length (a loop of one's own calls `fit_schedule(num_steps)` after building the model)."""
        return self.config.schedule.phase_steps(self.num_steps or DEFAULT_NUM_STEPS)

    def planned_reach(self, n: int) -> int:
        """The hard phase's planned band reach at length n: the calibrated / configured `reach`, else the balanced
        default (`core.planned_reach`)."""
        return planned_reach(self.config, n) if self.reach is None else self.reach

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        cfg = self.config
        b = x_BxNxD.shape[0]
        valid_len = jnp.broadcast_to(jnp.asarray(ctx.valid_len, jnp.int32), (b,))
        step = jnp.int32(schedule.INFERENCE_STEP) if ctx.step is None else ctx.step
        base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmarks, causal=ctx.causal)
        # Padded hidden states may hold anything (NaN included): select them away once, so that neither the
        # projections' and the router's weight gradients (x^T dq) nor the router losses ever multiply them.
        live = jnp.arange(x_BxNxD.shape[1])[None, :, None] < valid_len[:, None, None]
        x_BxNxD = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
        q, k, v = self.proj.qkv(x_BxNxD)
        r = self.router(x_BxNxD if cfg.router.input_gradient else jax.lax.stop_gradient(x_BxNxD))
        reach = self.planned_reach(x_BxNxD.shape[1])
        o, aux = label_core(q, k, v, r, cfg, base, step=step, valid_len=valid_len, steps=self.phase_steps(),
                            reach=reach)
        if self.capture_needed:
            self.sow(nnx.Intermediate, "reach_needed", aux["needed"])
        p, labels = aux["p"], aux["labels"]

        hard_sizes = jax.vmap(jax.vmap(lambda lab, vl: bucket_sizes(lab, cfg.num_labels, vl), (0, None)))(
            labels, valid_len
        )
        soft_sizes = losses.soft_sizes(p, valid_len)
        rc = cfg.router
        aux_losses = {"label_sparsity": rc.sparsity_weight * losses.sparsity(p, valid_len)}
        if rc.balance == "cv2":
            aux_losses["label_balance"] = rc.balance_weight * losses.cv2(soft_sizes)
        elif rc.balance == "switch":
            aux_losses["label_balance"] = rc.balance_weight * losses.switch(hard_sizes, soft_sizes)
        if rc.z_loss_weight:
            aux_losses["label_z_loss"] = rc.z_loss_weight * losses.z_loss(aux["r"], valid_len)

        stats = label_stats(
            aux["keys"],
            aux["hard_keys"],
            hard_sizes,
            heads=q.shape[2],
            head_dim=q.shape[3],
            causal=ctx.causal,
            valid_len=valid_len,
            overflow=aux["overflow"],
            needed=aux["needed"],
            reach=aux["reach"],
            tier=aux["tier"],
            dropped_BxPxN=aux["dropped"],
        )
        stats.update(tau=aux["tau"], phase=aux["phase"].astype(jnp.float32), hard_weight=aux["hard_weight"])
        stats = {name: jax.lax.stop_gradient(val) for name, val in stats.items()}
        return AttentionOutput(y=self.proj.out(o), aux_losses=aux_losses, stats=stats)

