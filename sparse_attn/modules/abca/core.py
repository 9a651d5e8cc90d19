"""The ABCA attention core (docs/abca.md): from projected q, k, v to the attention output, per head.

  1. anchor gather   anchors attend both zones they bound [causal: the zone before]   -> anchor states s
  2. handshake x h   s <- s + attn over {prev, self, next} anchors [causal: {prev, self}], or all anchors
                     ("global", first `max_anchors`), with queries/keys/values re-projected from s
  3. zone attention  interval tokens attend [left(t), right(t)] [causal: [left(t), t]], reading the two anchors'
                     post-handshake keys/values; anchors output their post-handshake state s

Stages 1 and 3 are `ZonePattern`s run by `sparse_attn.attention` with the chosen implementation: None (the
platform default, "packed"), "packed" (key-major anchor gather, zones packed in slots; the handshake on anchors in
rank space, in pages), "xla" / "pallas" (the stages' Intervals through the block-gather XLA executor / the Pallas
kernels; the handshake as a neighbour list through the XLA gather) or "reference" (dense oracle). All compute the
same function.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention, available_implementations, default_implementation
from sparse_attn.executors.abca import anchors
from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.patterns import abca
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.patterns.abca.handshake import anchor_positions
from sparse_attn.patterns.abca.zones import Zones
from sparse_attn.patterns.neighbours import NeighbourList


def check_options(
    *,
    max_zone: int,
    handshake: str,
    handshake_steps: int,
    max_anchors: int | None,
    implementation: str | None,
    slot_width: int | None,
) -> None:
    """The static options of the core: checked once, by `AnchorAttentionConfig` for the layer and by `abca_core`
    for direct callers (the layer calls `run_abca_core`, which checks nothing)."""
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
    have = available_implementations(ZonePattern)
    if implementation is not None and implementation not in have:
        raise ValueError(f"ABCA implementation must be None or one of {sorted(have)}, got {implementation!r}")
    if slot_width is not None and slot_width < max_zone:
        raise ValueError(f"slot_width ({slot_width}) must be >= max_zone ({max_zone})")


def _check_arrays(q, k, v, zones: Zones) -> None:
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(f"ABCA needs q [B, N, H, D] and k, v [B, N, G, D], got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
    if zones.is_anchor.shape != q.shape[:2]:
        raise ValueError(f"anchors {zones.is_anchor.shape} do not match q's [B, N] = {q.shape[:2]}")


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
    implementation: str | None = None,
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
      implementation: None, "packed", "xla", "pallas" or "reference" (module docstring).
      slot_width: queries per slot of the packed executor (default max_zone).

    Returns:
      (out [B, N, H, D], info): info holds `handshake_overflow` int32[B] and, for "packed", `slots_used` int32[B].
    """
    _check_arrays(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones)
    opts = dict(
        max_zone=max_zone,
        handshake=handshake,
        handshake_steps=handshake_steps,
        max_anchors=max_anchors,
        implementation=implementation,
        slot_width=slot_width,
    )
    check_options(**opts)
    qkv = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD)
    return run_abca_core(*qkv, zones, proj, causal=causal, gate_BxN=gate_BxN, scale=scale, **opts)


def run_abca_core(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    v_BxNxGxD: jax.Array,
    zones: Zones,
    proj: AnchorProjections,
    *,
    max_zone: int,
    causal: bool,
    handshake: str,
    handshake_steps: int,
    max_anchors: int | None,
    gate_BxN: jax.Array | None,
    scale: float | None,
    implementation: str | None,
    slot_width: int | None,
) -> tuple[jax.Array, dict]:
    """`abca_core` on inputs that are valid by construction: the layer, whose config checked the options once
    (`check_options` in `AnchorAttentionConfig`) and whose projections and zones have the right shapes."""
    impl = implementation or default_implementation(None, ZonePattern)
    q, k, v = q_BxNxHxD, k_BxNxGxD, v_BxNxGxD
    zones = opaque_zones(zones)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    gate = jnp.ones(zones.is_anchor.shape, jnp.float32) if gate_BxN is None else gate_BxN
    width = (slot_width or max_zone) if impl == "packed" else None

    def run(q_, k_, v_, stage):
        opts = {"slot_width": width} if width else {}
        pattern = ZonePattern(zones, stage=stage, causal=causal, max_zone=max_zone)
        return attention(q_, k_, v_, pattern, implementation=impl, scale=scale, **opts)

    s = run(q, k, v, "gather")
    hs = dict(causal=causal, handshake=handshake, steps=handshake_steps, max_anchors=max_anchors, scale=scale)
    if impl == "packed":
        s, k_a, v_a = _paged_handshake(s, zones, proj, groups=k.shape[2], max_zone=max_zone, **hs)
    else:
        s, k_a, v_a = _positional_handshake(s, zones, proj, groups=k.shape[2], impl=impl, **hs)
    anchor = zones.is_anchor[..., None, None]
    g = gate[..., None, None].astype(q.dtype)
    k3 = jnp.where(anchor, k_a, k)
    v3 = jnp.where(anchor, v_a * g, v)
    o = run(q, k3, v3, "zones")
    overflow = jnp.zeros_like(zones.num_anchors)
    if handshake == "global":
        overflow = jnp.maximum(zones.num_anchors - max_anchors, 0)
    info = {"handshake_overflow": overflow}
    if width:  # the executor's layout: the same pure function of the zones (XLA computes it once)
        info["slots_used"] = abca_packed.slot_layout(zones.left, zones.valid_len, width).used
    return jnp.where(anchor, s * g, o), info


def opaque_zones(zones: Zones) -> Zones:
    """The zones behind an optimization barrier, so that XLA treats them as run-time values.

    Zones known at compile time (computed eagerly and closed over, or from `fixed_interval_anchors` under `jit`) with
    a constant cotangent (a `sum` loss) make whole [B, N, H, D] steps of the backward pass constants, which XLA then
    evaluates while compiling: the transpose of the rank -> position gather, a scatter-add of N*H*D elements,
    constant-folded in 49-89 s on an H200 and 77 CPU-s here at n = 16384 (docs/abca.md, "Compile time"). Nothing
    the core computes depends on XLA knowing the anchors, and the barrier costs one no-op on O(N) integers.
    """
    return jax.lax.optimization_barrier(zones)


def _positional_handshake(s, zones, proj, *, groups, impl, causal, handshake, steps, max_anchors, scale):
    """The handshake as a position-space neighbour list (no kernel for K <= 3 rows: "pallas" runs its default)."""
    hs_impl = impl if impl in available_implementations(NeighbourList) else None
    pos = jnp.broadcast_to(jnp.arange(zones.num_tokens, dtype=jnp.int32)[None], zones.is_anchor.shape)
    if handshake == "chain":
        hs = abca.chain_handshake(zones, causal=causal)
    else:
        hs, _ = abca.global_handshake(zones, max_anchors=max_anchors, causal=causal)
    for _ in range(steps):
        qkv = (proj.query(s, pos), proj.key(s, pos), proj.value(s, pos))
        s = s + attention(*qkv, hs, implementation=hs_impl, scale=scale)
    return s, proj.key(s, pos, groups), proj.value(s, pos, groups)


# Below this many positions one page holds every possible anchor: the many-page branch (a second copy of the
# handshake and its backward pass) then is not compiled at all, and a page of <= 128 ranks costs little
# (docs/abca.md, "Compile time").
ONE_PAGE_UP_TO = 128


def handshake_page(n: int, max_zone: int, max_anchors: int | None) -> int:
    """Anchors per handshake page: `max_anchors`, else 4 ceil(n / max_zone) (4x the fewest anchors possible) but at
    least min(n, ONE_PAGE_UP_TO), so that one page holds every anchor in the common case; more anchors take more
    pages (exact, O(k) work)."""
    if max_anchors is not None:
        return min(n, max_anchors)
    return min(n, max(4 * math.ceil(n / max_zone), ONE_PAGE_UP_TO))


def _paged_handshake(s, zones, proj, *, groups, max_zone, causal, handshake, steps, max_anchors, scale):
    """The handshake on anchors in rank space, in pages; returns the anchors' (s, k, v) at their positions."""
    n = zones.num_tokens
    page = handshake_page(n, max_zone, max_anchors)
    num_pages = -(-n // page)

    def handshake_in(pages: int):
        def run(s):
            out = anchors.paged_handshake(
                s,
                zones,
                proj,
                scale,
                causal=causal,
                handshake=handshake,
                steps=steps,
                page=page,
                max_anchors=max_anchors,
                num_pages=pages,
                groups=groups,
            )
            # Back to position space inside the branch: the one-page branch's backward then gathers `page` ranks.
            rank = jnp.clip(zones.zone_id, 0, pages * page - 1)
            anc = jnp.minimum(anchor_positions(zones, pages * page), n)
            return tuple(anchors.rank_to_position(x, rank, zones.is_anchor, anc) for x in out)  # read at anchors

        return run

    # One page (every anchor fits) is the common case. The many-page branch is rematerialised, so that the cond
    # does not zero-fill its residuals on the one-page branch.
    if num_pages == 1:
        return handshake_in(1)(s)
    fits = jnp.all(zones.num_anchors <= page)
    return jax.lax.cond(fits, handshake_in(1), jax.checkpoint(handshake_in(num_pages)), s)
