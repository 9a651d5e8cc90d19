"""The ABCA attention core (SPEC §1): from projected q, k, v to the attention output, per head.

  1. anchor gather   anchors attend both zones they bound [causal: the zone before]   -> anchor states s
  2. handshake x h   s <- s + attn over {prev, self, next} anchors [causal: {prev, self}], or all anchors
                     ("global", first `max_anchors`), with queries/keys/values re-projected from s
  3. zone attention  interval tokens attend [left(t), right(t)] [causal: [left(t), t]], reading the two anchors'
                     post-handshake keys/values; anchors output their post-handshake state s

Implementations: "reference" (position-space patterns through the dense oracle), "xla_blocks" / "pallas" (the same
patterns through the library's block-gather XLA executor / its Pallas kernels: Triton on GPU, Mosaic on TPU,
interpret mode on CPU), "xla" (the default: key-major anchor gather, paged handshake, zones packed in slots). All
compute the same function.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention
from sparse_attn.executors import abca_packed
from sparse_attn.modules.abca import anchor_ops
from sparse_attn.modules.abca.anchor_ops import AnchorProjections
from sparse_attn.patterns import abca
from sparse_attn.patterns.abca.zones import Zones

IMPLEMENTATIONS = ("reference", "xla_blocks", "pallas", "xla")


def check_core_inputs(
    q,
    k,
    v,
    zones: Zones,
    *,
    max_zone: int,
    handshake: str,
    handshake_steps: int,
    max_anchors: int | None,
    implementation: str,
    slot_width: int | None,
) -> None:
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(f"ABCA needs q [B, N, H, D] and k, v [B, N, G, D], got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
    if zones.is_anchor.shape != q.shape[:2]:
        raise ValueError(f"anchors {zones.is_anchor.shape} do not match q's [B, N] = {q.shape[:2]}")
    if max_zone < 1:
        raise ValueError(f"max_zone must be >= 1, got {max_zone}")
    if handshake not in ("chain", "global"):
        raise ValueError(f"handshake must be 'chain' or 'global', got {handshake!r}")
    if handshake_steps < 1:
        raise ValueError(f"handshake_steps must be >= 1, got {handshake_steps}")
    if handshake == "global" and max_anchors is None:
        raise ValueError("handshake='global' needs a static max_anchors >= 1")
    if max_anchors is not None and max_anchors < 1:
        raise ValueError(f"max_anchors must be >= 1, got {max_anchors}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown ABCA implementation {implementation!r}; have {IMPLEMENTATIONS}")
    if slot_width is not None and slot_width < max_zone:
        raise ValueError(f"slot_width ({slot_width}) must be >= max_zone ({max_zone})")


def abca_core(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    v_BxNxGxD: jax.Array,
    zones: Zones,
    proj: AnchorProjections,
    *,
    max_zone: int,
    causal: bool = False,
    handshake: str = "chain",
    handshake_steps: int = 1,
    max_anchors: int | None = None,
    gate_BxN: jax.Array | None = None,
    scale: float | None = None,
    implementation: str = "xla",
    slot_width: int | None = None,
) -> tuple[jax.Array, dict]:
    """One ABCA attention over zones whose anchors lie at most `max_zone` apart.

    Args:
      q_BxNxHxD, k_BxNxGxD, v_BxNxGxD: projected queries, keys, values (RoPE already applied to q, k); G KV heads
        (H % G == 0, grouped-query attention): anchor states stay per query head, and an anchor's zone key/value
        for group g re-projects the states of g's heads (`AnchorProjections.key(..., groups=G)`).
      zones: from `patterns.abca.compute_zones` on an anchor mask that satisfies the zone cap.
      proj: the anchor re-projections.
      gate_BxN: multiplies anchor outputs and values (1.0 forward; the straight-through path of learned placement).
      slot_width: queries per slot of the packed executor (default max_zone).

    Returns:
      (out [B, N, H, D], info): info holds `handshake_overflow` int32[B] and, for "xla", `slots_used` int32[B].
    """
    check_core_inputs(
        q_BxNxHxD,
        k_BxNxGxD,
        v_BxNxGxD,
        zones,
        max_zone=max_zone,
        handshake=handshake,
        handshake_steps=handshake_steps,
        max_anchors=max_anchors,
        implementation=implementation,
        slot_width=slot_width,
    )
    scale = 1.0 / math.sqrt(q_BxNxHxD.shape[-1]) if scale is None else scale
    gate = jnp.ones(zones.is_anchor.shape, jnp.float32) if gate_BxN is None else gate_BxN
    kw = {
        "max_zone": max_zone,
        "causal": causal,
        "handshake": handshake,
        "handshake_steps": handshake_steps,
        "max_anchors": max_anchors,
        "scale": scale,
    }
    if implementation == "xla":
        return _packed(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones, proj, gate, slot_width=slot_width or max_zone, **kw)
    return _positional(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones, proj, gate, implementation=implementation, **kw)


def _positional(
    q, k, v, zones, proj, gate, *, max_zone, causal, handshake, handshake_steps, max_anchors, scale, implementation
):
    """Every stage as a position-space pattern run by `sparse_attn.attention`."""
    impl = "xla" if implementation == "xla_blocks" else implementation
    run = lambda q_, k_, v_, p: attention(q_, k_, v_, p, implementation=impl, scale=scale)
    pos = jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32)[None], zones.is_anchor.shape)
    s = run(q, k, v, abca.gather_intervals(zones, causal=causal, max_zone=max_zone))
    if handshake == "chain":
        hs, overflow = abca.chain_handshake(zones, causal=causal), jnp.zeros_like(zones.num_anchors)
    else:
        hs, overflow = abca.global_handshake(zones, max_anchors=max_anchors, causal=causal)
    for _ in range(handshake_steps):
        s = s + run(proj.query(s, pos), proj.key(s, pos), proj.value(s, pos), hs)
    anchor = zones.is_anchor[..., None, None]
    g = gate[..., None, None].astype(q.dtype)
    groups = k.shape[2]
    k3 = jnp.where(anchor, proj.key(s, pos, groups), k)
    v3 = jnp.where(anchor, proj.value(s, pos, groups) * g, v)
    o = run(q, k3, v3, abca.zone_intervals(zones, causal=causal, max_zone=max_zone))
    return jnp.where(anchor, s * g, o), {"handshake_overflow": overflow}


def slot_chunk(batch_heads: int, slot_width: int) -> int:
    """Slots per scan step: about one 256 x 257 x 4-head score tile. Re-measured on the head-major executor (the
    core's jitted fwd+bwd with this function patched to a constant, median of 10 calls): n=4096, H=4: 1 slot
    75-77 ms, 2: 71, 4: 74; n=16384, H=1: 1: 87, 2: 70, 4: 78-117, 8: 108 -- within this machine's run-to-run noise
    except for 8, so the rule stays."""
    return max(1, (256 * 257 * 4) // (batch_heads * slot_width * (slot_width + 1)))


def handshake_page(n: int, max_zone: int, max_anchors: int | None) -> int:
    """Anchors per handshake page: `max_anchors`, else 4 ceil(n / max_zone) (4x the fewest anchors possible), so
    that one page holds every anchor in the common case; more anchors take more pages (exact, O(k) work)."""
    return min(n, max_anchors if max_anchors is not None else 4 * math.ceil(n / max_zone))


def _packed(
    q, k, v, zones, proj, gate, *, max_zone, causal, handshake, handshake_steps, max_anchors, scale, slot_width
):
    """Stage 1 key-major (O(N), any k); the handshake on anchors in rank space, in pages; zones packed in slots."""
    b = zones.is_anchor.shape[0]
    n = zones.num_tokens
    s = anchor_ops.anchor_gather(q, k, v, zones, scale, causal=causal)
    page = handshake_page(n, max_zone, max_anchors)
    num_pages = -(-n // page)

    def handshake_in(pages: int):
        def run(s):
            out = anchor_ops.paged_handshake(
                s,
                zones,
                proj,
                scale,
                causal=causal,
                handshake=handshake,
                steps=handshake_steps,
                page=page,
                max_anchors=max_anchors,
                num_pages=pages,
                groups=k.shape[2],
            )
            pad = ((0, 0), (0, (num_pages - pages) * page), (0, 0), (0, 0))  # both branches return every rank
            return tuple(jnp.pad(x, pad) for x in out)

        return run

    # One page (every anchor fits) is the common case. The many-page branch is rematerialised, so that the cond
    # does not zero-fill its residuals on the one-page branch.
    if num_pages == 1:
        ranked = handshake_in(1)(s)
    else:
        fits = jnp.all(zones.num_anchors <= page)
        ranked = jax.lax.cond(fits, handshake_in(1), jax.checkpoint(handshake_in(num_pages)), s)
    bi = jnp.arange(b)[:, None]
    rank = jnp.clip(zones.zone_id, 0, num_pages * page - 1)
    s, k_a, v_a = (x[bi, rank] for x in ranked)  # rank -> position (read at anchors only)
    overflow = jnp.maximum(zones.num_anchors - max_anchors, 0) if handshake == "global" else None
    anchor = zones.is_anchor[..., None, None]
    g = gate[..., None, None].astype(q.dtype)
    k3 = jnp.where(anchor, k_a, k)
    v3 = jnp.where(anchor, v_a * g, v)
    zlo, zhi = abca.zone_lo_hi(zones, causal)
    rows = ~zones.is_anchor & (zones.left >= 0)
    layout = abca_packed.slot_layout(zones.left, zones.valid_len, slot_width)
    o, _ = abca_packed.packed_zone_attention(
        q,
        k3,
        v3,
        jnp.where(rows, zlo, 0),
        jnp.where(rows, zhi, -1),
        layout,
        scale,
        chunk=slot_chunk(b * q.shape[2], slot_width),
    )
    info = {
        "handshake_overflow": jnp.zeros_like(zones.num_anchors) if overflow is None else overflow,
        "slots_used": layout.used,
    }
    return jnp.where(anchor, s * g, o), info
