"""Decoder of label attention in its hard phase (inference): window ring + landmark store, each key with its labels.

A new query attends the keys of its causal window and the earlier landmarks it shares a label with, and itself
(docs/labels.md's rule, `LabelPattern.allowed`). The cache holds, per layer, a ring of the last `radius + 1`
keys and values with their label bitmasks and the keys, values and bitmasks of the landmarks (every
`landmark_every`-th position): memory O(window + landmarks). Whatever the checkpoint's phase, decoding runs the
hard phase; `phase_at(module, step)` says which phase the trained model was in (the driver warns when it is not
hard).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.decode.attend import attend, project, write_slot
from sparse_attn.decode.registry import DecodeContext
from sparse_attn.modules.labels import LabelAttention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import position
from sparse_attn.patterns.labels import schedule


def phase_at(module: LabelAttention, step: int) -> str:
    """The phase ("soft", "ramp", "straight_through" or "hard") label layer `module` runs at train step `step`."""
    cfg = module.config
    if cfg.phase != "schedule":
        return cfg.phase
    steps = module.phase_steps()
    idx = int(schedule.phase(step, soft_steps=steps.soft, ramp_steps=steps.ramp,
                             straight_through_steps=steps.straight_through))
    return {v: k for k, v in schedule.PHASES.items()}[idx]


def landmark_stride(config) -> int:
    """The landmark stride in use (0: none); `landmark_every=None` means one per window (docs/labels.md)."""
    return config.landmarks


def _num_landmarks(config, max_len: int) -> int:
    every = landmark_stride(config)
    return len(range(0, max_len, every)) if every else 0


def init_cache(module: LabelAttention, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    cfg, proj = module.config, module.proj
    s, lm = min(cfg.radius + 1, max_len), _num_landmarks(cfg, max_len)
    p, w = module.router.label_heads, bits_lib.num_words(cfg.total_labels)
    g, d = proj.num_kv_heads, proj.head_dim
    return {
        "k": jnp.zeros((batch, s, g, d), dtype), "v": jnp.zeros((batch, s, g, d), dtype),
        "bits": jnp.zeros((batch, p, s, w), jnp.uint32), "pos": jnp.full((s,), -1, jnp.int32),
        "lk": jnp.zeros((batch, lm, g, d), dtype), "lv": jnp.zeros((batch, lm, g, d), dtype),
        "lbits": jnp.zeros((batch, p, lm, w), jnp.uint32),
    }


def step(module: LabelAttention, x_Bx1xD: jax.Array, cache: dict, ctx: DecodeContext):
    cfg = module.config
    pos = jnp.asarray(ctx.pos, jnp.int32)
    q, k, v = project(module.proj, x_Bx1xD, pos)
    labels_BxPx1xK = bits_lib.top_k_labels(module.router(x_Bx1xD), cfg.top_k)
    if cfg.position_cell:  # the token's position labels at its absolute position, as in the full pass
        extra_2 = position.position_labels(pos, cfg.position_cell, cfg.radius, cfg.num_labels)
        extra = jnp.broadcast_to(extra_2, labels_BxPx1xK.shape[:3] + (2,)).astype(labels_BxPx1xK.dtype)
        labels_BxPx1xK = jnp.concatenate([labels_BxPx1xK, extra], axis=-1)
    bits_BxPxW = bits_lib.pack_labels(labels_BxPx1xK, cfg.total_labels)[:, :, 0]

    s = cache["pos"].shape[0]
    slot = pos % s
    cache = dict(cache, k=write_slot(cache["k"], slot, k), v=write_slot(cache["v"], slot, v),
                 pos=cache["pos"].at[slot].set(pos),
                 bits=jax.lax.dynamic_update_index_in_dim(cache["bits"], bits_BxPxW, slot, axis=2))
    kpos_S = cache["pos"]
    share_BxPxS = bits_lib.shares(bits_BxPxW[:, :, None], cache["bits"])
    in_window_S = (kpos_S >= 0) & (kpos_S <= pos) & (pos - kpos_S <= cfg.radius)
    ok_ring = in_window_S[None, None] & (share_BxPxS | (kpos_S == pos)[None, None])
    keys, vals, ok = cache["k"], cache["v"], ok_ring

    lm = cache["lk"].shape[1]
    if lm:
        every = landmark_stride(cfg)
        is_landmark = pos % every == 0
        lslot = jnp.minimum(pos // every, lm - 1)
        cache["lk"] = jnp.where(is_landmark, write_slot(cache["lk"], lslot, k), cache["lk"])
        cache["lv"] = jnp.where(is_landmark, write_slot(cache["lv"], lslot, v), cache["lv"])
        new_lbits = jax.lax.dynamic_update_index_in_dim(cache["lbits"], bits_BxPxW, lslot, axis=2)
        cache["lbits"] = jnp.where(is_landmark, new_lbits, cache["lbits"])
        lpos_L = jnp.arange(lm, dtype=jnp.int32) * every
        # Landmarks inside the window are read from the ring, not twice (BaseGraph.landmark_edge).
        outside_L = (lpos_L <= pos) & (pos - lpos_L > cfg.radius)
        ok_lm = outside_L[None, None] & bits_lib.shares(bits_BxPxW[:, :, None], cache["lbits"])
        keys = jnp.concatenate([keys, cache["lk"]], axis=1)
        vals = jnp.concatenate([vals, cache["lv"]], axis=1)
        ok = jnp.concatenate([ok, ok_lm], axis=-1)
    o = attend(q, keys, vals, ok)  # ok [B, P, S']: P = 1 shared by heads, or one per head
    return module.proj.wo(o.reshape(o.shape[0], 1, -1)), cache
