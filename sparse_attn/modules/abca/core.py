"""The ABCA attention core (docs/abca.md): from projected q, k, v to the attention output, per head.

  1. anchor gather   anchors attend both zones they bound [causal: the zone before]   -> anchor states s
  2. handshake x h   s <- s + attn over {prev, self, next} anchors [causal: {prev, self}], or all anchors
                     ("global", first `max_anchors`), with queries/keys/values re-projected from s
  3. zone attention  interval tokens attend [left(t), right(t)] [causal: [left(t), t]], reading the two anchors'
                     post-handshake keys/values; anchors output their post-handshake state s

With P = `summaries_per_anchor` > 1 (pooled writes, docs/abca.md) every anchor also writes P - 1 more summaries:
summary p gathers with its own query (the anchor's q through `summary_wq[p - 1]`), shakes hands with summary p
of the other anchors, and stage 3's rows read it as one more key/value of each anchor they hold (merged with the
stage's own softmax through its log-sum-exp). Summary 0 is the anchor's own state, and the anchors' output.

Stages 1 and 3 are `ZonePattern`s run by `sparse_attn.attention` with the chosen implementation, the one executor
choice of the core: None (the registry's default for the ZonePattern, "packed"), "packed" (key-major anchor gather,
zones packed in slots; the handshake on anchors in rank space, in pages), "xla" / "pallas" (the stages' Intervals
through the block-gather XLA executor / the Pallas kernels) or "reference" (dense oracle). Outside "packed" the
handshake is a position-space `NeighbourList`, run by the registry's counterpart of that choice (the same name where
neighbour lists have it: "xla", "reference"; else their default: "pallas" has no kernel for them). All compute the
same function.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention, available_implementations, resolve_implementation
from sparse_attn.executors import registry
from sparse_attn.executors.abca import anchors
from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.executors.softmax import merge_lse
from sparse_attn.patterns import abca
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.patterns.abca.handshake import anchor_positions
from sparse_attn.patterns.abca.zones import Zones


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


def _check_arrays(q, k, v, zones: Zones, summary_wq=None) -> None:
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(f"ABCA needs q [B, N, H, D] and k, v [B, N, G, D], got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
    if zones.is_anchor.shape != q.shape[:2]:
        raise ValueError(f"anchors {zones.is_anchor.shape} do not match q's [B, N] = {q.shape[:2]}")
    h, d = q.shape[2:]
    if summary_wq is not None and (summary_wq.ndim != 4 or summary_wq.shape[1:] != (h, d, d)):
        raise ValueError(f"summary_wq must be [P - 1, H, D, D] = [P - 1, {h}, {d}, {d}], got {summary_wq.shape}")


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
    summary_wq: jax.Array | None = None,
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
      summary_wq: [P - 1, H, D, D], the extra anchor summaries' gather-query maps (module docstring); None = one
        summary per anchor, the research document's layer.

    Returns:
      (out [B, N, H, D], info): info holds `handshake_overflow` int32[B] and, for "packed", `slots_used` int32[B].
    """
    _check_arrays(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones, summary_wq)
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
    return run_abca_core(*qkv, zones, proj, causal=causal, gate_BxN=gate_BxN, scale=scale, summary_wq=summary_wq,
                         **opts)  # fmt: skip


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
    summary_wq: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """`abca_core` on inputs that are valid by construction: the layer, whose config checked the options once
    (`check_options` in `AnchorAttentionConfig`) and whose projections and zones have the right shapes."""
    q, k, v = q_BxNxHxD, k_BxNxGxD, v_BxNxGxD
    zones = opaque_zones(zones)
    impl = resolve_implementation(ZonePattern(zones, stage="gather", causal=causal, max_zone=max_zone), implementation)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    gate = jnp.ones(zones.is_anchor.shape, jnp.float32) if gate_BxN is None else gate_BxN
    width = (slot_width or max_zone) if impl == "packed" else None

    def run(q_, k_, v_, stage, **kw):
        opts = {"slot_width": width} if width else {}
        pattern = ZonePattern(zones, stage=stage, causal=causal, max_zone=max_zone)
        return attention(q_, k_, v_, pattern, implementation=impl, scale=scale, **opts, **kw)

    hs = dict(causal=causal, handshake=handshake, steps=handshake_steps, max_anchors=max_anchors, scale=scale)

    def summary(q_gather):  # stages 1 and 2: an anchor summary's (s, k, v) at the anchor positions
        s_ = run(q_gather, k, v, "gather")
        if impl == "packed":
            return _paged_handshake(s_, zones, proj, groups=k.shape[2], max_zone=max_zone, **hs)
        return _positional_handshake(s_, zones, proj, groups=k.shape[2], impl=impl, **hs)

    s, k_a, v_a = summary(q)
    anchor = zones.is_anchor[..., None, None]
    g = gate[..., None, None].astype(q.dtype)
    k3 = jnp.where(anchor, k_a, k)
    v3 = jnp.where(anchor, v_a * g, v)
    if summary_wq is None:
        o = run(q, k3, v3, "zones")
    else:
        extra = []
        for w_HxDxD in summary_wq:
            _, k_p, v_p = summary(jnp.einsum("bnhd,hde->bnhe", q, w_HxDxD.astype(q.dtype)))
            extra.append((k_p, v_p * g))
        o, lse = run(q, k3, v3, "zones", return_lse=True)
        o = read_summaries(o, lse, q, zones, extra, causal=causal, scale=scale)
    overflow = jnp.zeros_like(zones.num_anchors)
    if handshake == "global":
        overflow = jnp.maximum(zones.num_anchors - max_anchors, 0)
    info = {"handshake_overflow": overflow}
    if width:  # the executor's layout: the same pure function of the zones (XLA computes it once)
        info["slots_used"] = abca_packed.slot_layout(zones.left, zones.valid_len, width).used
    return jnp.where(anchor, s * g, o), info


def read_summaries(o_BxNxHxD, lse_BxNxH, q_BxNxHxD, zones: Zones, summaries, *, causal: bool, scale: float):
    """Stage 3's output with each row's softmax widened to the extra summaries of the anchors it holds
    (`patterns.abca.anchors_read`): `summaries` is [(k, v) [B, N, G, D] at the anchor positions] per summary.

    Each extra key is one more partial softmax (its value, its logit as lse; -inf where the row does not hold that
    anchor), merged with the stage's (out, lse) by `merge_lse`: rows without keys stay 0, and a summary no row
    reads gets exactly zero gradient."""
    b, n, h, _ = q_BxNxHxD.shape
    pos, reads = abca.anchors_read(zones, causal)  # [B, N, 2]
    outs, lses = [o_BxNxHxD.astype(jnp.float32)[:, :, :, None]], [lse_BxNxH[..., None]]
    for k_BxNxGxD, v_BxNxGxD in summaries:
        rep = h // k_BxNxGxD.shape[2]  # KV group of each query head

        def at(x, rep=rep):  # [B, N, 2, H, D]
            return jnp.repeat(jax.vmap(lambda x_, i: x_[i])(x, pos), rep, axis=3)

        k_BxNx2xHxD, v_BxNx2xHxD = at(k_BxNxGxD.astype(jnp.float32)), at(v_BxNxGxD.astype(jnp.float32))
        logits = jnp.einsum("bnhd,bnjhd->bnhj", q_BxNxHxD.astype(jnp.float32), k_BxNx2xHxD,
                            precision=jax.lax.Precision.HIGHEST) * scale  # fmt: skip
        held = reads[:, :, None, :]  # [B, N, 1, 2]
        lses.append(jnp.where(held, logits, -jnp.inf))
        outs.append(jnp.where(held[..., None], jnp.moveaxis(v_BxNx2xHxD, 2, 3), 0.0))  # [B, N, H, 2, D]
    out, _ = merge_lse(jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3), axis=3)
    return out.astype(o_BxNxHxD.dtype)


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
    """The handshake as a position-space neighbour list, run by the registry's counterpart of the stages' executor
    (no kernel for K <= 3 rows: "pallas" runs the neighbour lists' default)."""
    pos = jnp.broadcast_to(jnp.arange(zones.num_tokens, dtype=jnp.int32)[None], zones.is_anchor.shape)
    if handshake == "chain":
        hs = abca.chain_handshake(zones, causal=causal)
    else:
        hs, _ = abca.global_handshake(zones, max_anchors=max_anchors, causal=causal)
    hs_impl = registry.counterpart(hs, impl)
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
