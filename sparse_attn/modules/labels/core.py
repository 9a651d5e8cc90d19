"""The label attention core (docs/labels.md): routing logits and projected q, k, v -> output and aux, per phase.

  soft              p = memberships(R, τ); logits q·k/√D + log(q_uv + ε) on E(H) (`executors.labels.soft`)
  ramp              the soft score blended into the hard pattern, weight α rising 0 -> 1 over the phase, and the
                    edges the hard pattern drops thinned (each present with probability 1 - α, drawn per step)
  straight-through  the hard pattern forward, the soft score's gradient to the router
  hard              top-k labels -> `LabelPattern` -> `sparse_attn.attention` (default "bucketed", exact for any
                    router), whose aux gives each query's allowed keys and the band tier it chose

The soft phases take memberships, not a pattern, so they call their executor directly (docs/labels.md, "How the
module reaches its executors").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention, resolve_implementation
from sparse_attn.executors.labels.bucketed import default_reach
from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import position, schedule, soft
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern
from sparse_attn.patterns.stats import key_counts

# Phase -> branch of the switch: soft, ramp and straight-through share one (the ramp is the soft pass with α > 0;
# straight-through scores the same band and picks its weights by a `lax.cond` inside, so the band's scores and
# their backward are compiled once, not twice); the hard phase is the other.
_BRANCH = (0, 0, 0, 1)


def memberships(r_BxPxNxL, tau, *, kind: str, top_k: int):
    """p of the soft score: "centred" (tends to the top-k labels as τ -> 0) or "sigmoid" σ(R/τ)."""
    return soft.centred_memberships(r_BxPxNxL, tau, top_k) if kind == "centred" else soft.memberships(r_BxPxNxL, tau)


def label_core(q, k, v, r_BxPxNxL, cfg, base: BaseGraph, *, step, valid_len, steps: schedule.Schedule | None = None,
               reach: int | None = None):
    """Attention output [B, N, H, D] and aux: keys / hard_keys int32[B, P, N], overflow, needed, tier, reach, p,
    labels, tau, phase, hard_weight, dropped float32[B, P, N], r (the routing logits the router losses take: without
    gradient in the hard phase under `cfg.router.freeze_when_hard`).

    `cfg`: a `LabelAttentionConfig`; `steps`: its phase lengths for this run (default: for its schedule's
    `num_steps`, else `schedule.DEFAULT_NUM_STEPS`). The phase follows `cfg.phase` (or the step, under "schedule":
    one `lax.switch`, so a jitted train step never recompiles when the phase changes).
    `keys`: what each query attends in this forward (soft: every edge of H, weighted; ramp: those the thinning
    keeps; straight-through and hard: the hard pattern); `hard_keys`: the hard pattern's keys (self included).
    `overflow`: hard-phase bucket entries whose range exceeded the planned reach (they ran a wider band tier,
    exactly); `needed`: the widest reach a block needed; `tier`: the band tier that ran (0: the planned band; 0
    outside the hard phase); `reach`: the planned reach — the argument (a calibrated capacity), else
    `cfg.capacity.reach`, else `default_reach` for balanced buckets (`planned_reach`).
    `dropped`: the forward's attention weight on edges the hard pattern drops (soft and ramp; 0 afterwards).
    """
    n = q.shape[1]
    steps = cfg.schedule.phase_steps() if steps is None else steps
    tau = schedule.temperature(step, tau_start=cfg.schedule.tau_start, tau_end=cfg.schedule.tau_end,
                               anneal_steps=steps.anneal)
    if cfg.phase == "schedule":
        idx = schedule.phase(step, soft_steps=steps.soft, ramp_steps=steps.ramp,
                             straight_through_steps=steps.straight_through)
        alpha = schedule.hard_weight(step, soft_steps=steps.soft, ramp_steps=steps.ramp)
    else:
        idx = jnp.int32(schedule.PHASES[cfg.phase])
        alpha = jnp.float32(0.0)
    if cfg.router.freeze_when_hard:
        # The hard phase's top-k has no task gradient; the router losses alone would still move the router, and the
        # pattern with it, with no regard for the task (docs/labels.md, "Phase transitions"): frozen there.
        r_BxPxNxL = jnp.where(idx == schedule.HARD, jax.lax.stop_gradient(r_BxPxNxL), r_BxPxNxL)
    p = memberships(r_BxPxNxL, tau, kind=cfg.router.membership, top_k=cfg.top_k)
    labels = bits_lib.top_k_labels(jax.lax.stop_gradient(r_BxPxNxL), cfg.top_k)
    # The pattern's labels: the router's, plus the position labels that keep near pairs (patterns/labels/position.py).
    # The router's losses and statistics see its own labels and memberships only (aux p, labels).
    labels_all, p_all, total = labels, p, cfg.num_labels
    if cfg.position_cell:
        labels_all, p_all, total = position.with_position_labels(labels, p, cfg.position_cell, cfg.radius)
    bits = bits_lib.pack_labels(labels_all, total)
    reach = planned_reach(cfg, n) if reach is None else reach
    zero = jnp.int32(0)

    def soft_like(mode):
        def run():
            straight = (idx == schedule.STRAIGHT_THROUGH) if mode == "either" else None
            kw = dict(base=base, mode=mode, eps=cfg.eps, valid_len=valid_len, block=cfg.capacity.soft_block)
            seed = step if cfg.ramp_thinning and mode != "straight_through" else None  # soft rows only
            o, _, info = soft_label_attention(q, k, v, p_all, bits, hard_weight=alpha, thin_seed=seed,
                                              straight_through=straight, **kw)
            keys = {"soft": info["edges"], "straight_through": info["keys"]}.get(mode)
            if mode == "either":  # what the rows attend: every edge of H (thinned in the ramp), or the hard pattern
                keys = jnp.where(straight, info["keys"], info["edges"])
            return o, keys, info["keys"], zero, zero, zero, info["dropped"]

        return run

    def hard():
        o, keys, overflow, needed, tier = hard_attention(q, k, v, labels_all, bits, total, cfg, base, valid_len,
                                                         reach)
        return o, keys, keys, overflow, needed, tier, jnp.zeros(keys.shape, jnp.float32)

    if cfg.phase == "schedule":
        outs = jax.lax.switch(jnp.asarray(_BRANCH, jnp.int32)[idx], (soft_like("either"), hard))
    else:
        outs = {"soft": soft_like("soft"), "straight_through": soft_like("straight_through"), "hard": hard}[cfg.phase]()
    o, keys, hard_keys, overflow, needed, tier, dropped = outs
    aux = dict(keys=keys, hard_keys=hard_keys, overflow=overflow, needed=needed, tier=tier, reach=reach, p=p,
               labels=labels, tau=tau, phase=idx, hard_weight=alpha, dropped=dropped, r=r_BxPxNxL)
    return o, aux


def planned_reach(cfg, n: int) -> int:
    """The hard phase's planned band reach for length n: `cfg.capacity.reach` when set, else `default_reach`
    (balanced buckets, `cfg.capacity.reach_factor`)."""
    if cfg.capacity.reach is not None:
        return cfg.capacity.reach
    reach = default_reach(n, BaseGraph(radius=cfg.radius), cfg.num_labels, cfg.top_k, cfg.capacity.reach_factor)
    # A position label's bucket entries are runs of one cell: its ranges need up to `position_cell` entries.
    return max(reach, min(-(-cfg.position_cell // 8) * 8, n)) if cfg.position_cell else reach


def hard_attention(q, k, v, labels_BxPxNxK, bits, num_labels: int, cfg, base: BaseGraph, valid_len, reach: int):
    """The hard phase through `sparse_attn.attention` with `cfg.implementation` (None: the registry's default for
    the `LabelPattern`, "bucketed"): (out, keys int32[B, P, N], overflow, needed, tier). Executors without diagnostics
    ("reference", "xla", "pallas") report keys from the pattern and no band overflow (tier 0). `bits`: the labels
    packed (`bits.pack_labels`), already built by the core; `num_labels`: how many labels they number (the router's,
    plus the position labels when `cfg.position_cell`)."""
    pattern = LabelPattern(bits, valid_len, base, labels_BxPxNxK, num_labels)
    impl = resolve_implementation(pattern, cfg.implementation)
    opts = dict(block=cfg.capacity.block, reach=reach) if impl == "bucketed" else {}
    o, info = attention(q, k, v, pattern, implementation=impl, return_aux=True, **opts)
    shape = labels_BxPxNxK.shape[:3]
    keys = info["keys"] if "keys" in info else jnp.broadcast_to(key_counts(pattern)[0], shape)
    zero = jnp.int32(0)
    overflow, needed, tier = (info.get(name, zero).astype(jnp.int32) for name in ("overflow", "needed", "tier"))
    return o, keys, overflow, needed, tier
