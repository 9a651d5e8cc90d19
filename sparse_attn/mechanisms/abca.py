"""ABCA (`modules.abca`): anchors, zones and the boundary handshake; the runner's presets and the budget grids'."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.decode import abca as decode
from sparse_attn.mechanisms.common import NEWLINE, sized
from sparse_attn.modules.abca import AnchorAttention, AnchorAttentionConfig, AnchorProjections, abca_core
from sparse_attn.modules.abca.config import ExplicitAnchors, FixedAnchors, LearnedAnchors
from sparse_attn.modules.abca.stats import abca_stats
from sparse_attn.patterns import abca
from sparse_attn.registry import BenchCore, Decoder, Mechanism, Preset
from sparse_attn.studies.bench import BenchSpec, qkv


def abca_keys(cfg: AnchorAttentionConfig, n: int, tokens_BxN=None) -> float:
    """Keys per query for the anchors the layer gets, exactly (anchor gather + zones + every handshake step).
    Explicit anchors depend on the text (counted on `tokens_BxN`, windows of the corpus); learned placement is
    counted as before training, when the score head places no anchor and the cap inserts one every `max_zone`
    tokens (trained anchors only shorten zones: the learned run's upper bound)."""
    placement = cfg.placement
    if isinstance(placement, ExplicitAnchors):
        if tokens_BxN is None:
            raise ValueError("explicit ABCA anchors depend on the text: pass tokens (windows of the corpus)")
        tokens = jnp.asarray(tokens_BxN, jnp.int32)
        if tokens.shape[1] != n:
            raise ValueError(f"tokens have length {tokens.shape[1]}, expected n={n}")
        raw = abca.explicit_anchors(tokens_BxN=tokens, anchor_id=placement.anchor_id, vocab_size=placement.vocab_size)
    elif isinstance(placement, FixedAnchors):
        raw = abca.fixed_interval_anchors(1, n, placement.interval)
    else:
        raw = jnp.zeros((1, n), bool)
    valid = jnp.full((raw.shape[0],), n, jnp.int32)
    is_anchor, inserted = abca.enforce_zone_cap(raw, valid, cfg.max_zone)
    zones = abca.compute_zones(is_anchor, valid)
    max_anchors = cfg.max_anchors if cfg.max_anchors is not None else 4 * math.ceil(n / cfg.max_zone)
    st = abca_stats(zones, inserted, {}, causal=True, handshake=cfg.handshake, handshake_steps=cfg.handshake_steps,
                    max_anchors=max_anchors, summaries_per_anchor=cfg.summaries_per_anchor)
    return float(st["keys_per_query"])


def _explicit(ctx) -> AnchorAttentionConfig:
    """Explicit anchors at the task's anchor token (fixed every `anchors.interval` if it has none)."""
    a, w = ctx.anchors, ctx.window
    if a.anchor_id is not None:
        return AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=a.anchor_id, vocab_size=a.vocab_size),
                                     max_zone=w, implementation=ctx.implementation)
    return AnchorAttentionConfig(placement=FixedAnchors(interval=min(a.interval or w, w)), max_zone=w,
                                 implementation=ctx.implementation)


def _newline(**kw):
    return lambda z, n, t: AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=NEWLINE, vocab_size=256),
                                                 max_zone=z, **kw)


def _fixed(**kw):
    return lambda z, n, t: AnchorAttentionConfig(placement=FixedAnchors(interval=z), max_zone=z, **kw)


def _global(build):
    # The global handshake's dense head holds 4 ceil(n / max_zone) anchors (the packed core's page default).
    return lambda z, n, t: dataclasses.replace(build(z, n, t), handshake="global", max_anchors=4 * math.ceil(n / z))


def _learned(ctx) -> AnchorAttentionConfig:
    return AnchorAttentionConfig(placement=LearnedAnchors(boundary_ids=ctx.anchors.boundary_ids), max_zone=ctx.window,
                                 implementation=ctx.implementation)


def _bench_anchors(spec: BenchSpec, random_zones: bool):
    """Anchors every 256 tokens, or zone sizes uniform in [128, 384] (the same mean 256) per batch row."""
    if not random_zones:
        return jnp.broadcast_to(jnp.arange(spec.n)[None] % 256 == 0, (spec.batch, spec.n)), 256
    rng = np.random.default_rng(0)
    mask = np.zeros((spec.batch, spec.n), bool)
    for row in mask:
        pos = 0
        while pos < spec.n:
            row[pos] = True
            pos += int(rng.integers(128, 385))
    return jnp.asarray(mask), 384


def bench_core(spec: BenchSpec, random_zones: bool = False) -> BenchCore:
    """ABCA's core (anchor gather, chain handshake, zone attention) on explicit anchors, the spec's executor for the
    zone pattern; zones and projections are arguments (the full module's benchmark: experiments/benchmarks/abca.py)."""
    mask, cap = _bench_anchors(spec, random_zones)
    zones = abca.compute_zones(abca.enforce_zone_cap(mask, None, cap)[0])
    scale = spec.head_dim**-0.5
    ws = [(jax.random.normal(k, (spec.heads, spec.head_dim, spec.head_dim)) * scale).astype(spec.dtype)
          for k in jax.random.split(jax.random.fold_in(spec.key, 1), 3)]  # fmt: skip
    proj = AnchorProjections(*ws, rope_base=1e4)

    def fn(q, k, v, zones, proj):
        return abca_core(q, k, v, zones, proj, max_zone=cap, causal=spec.causal, implementation=spec.impl)[0], None

    return BenchCore(fn, (*qkv(spec), zones, proj), abca.layer_intervals(zones, causal=spec.causal, max_zone=cap))


RECORD = Mechanism(
    name="abca",
    configs=(AnchorAttentionConfig,),
    module=AnchorAttention,
    presets={
        # At the byte LM's context the runner's `abca` and `abca_learned` are the budget grids' (anchors at newlines).
        "abca": Preset(config=_explicit, budget=_newline(), tuned="max_zone"),
        "abca_hs2": sized(_newline(handshake_steps=2), "max_zone", encoder=False),
        "abca_global": sized(_global(_newline()), "max_zone", encoder=False),
        "abca_fixed": sized(_fixed(), "interval"),
        "abca_learned": Preset(config=_learned, budget=lambda z, n, t: AnchorAttentionConfig(
            placement=LearnedAnchors(boundary_ids=(NEWLINE,)), max_zone=z), tuned="max_zone"),
        # fixed anchors with the global handshake (every anchor reads every earlier anchor): tasks without newlines
        "abca_fixed_global": sized(_global(_fixed()), "interval", encoder=False),
        # pooled writes, P summaries per anchor; their keys are counted, so zones shrink at the same budget. Not
        # monotone: tiny zones make every token an anchor.
        "abca_fixed_p2": sized(_fixed(summaries_per_anchor=2), "interval", monotone=False, encoder=False),
        "abca_fixed_p4": sized(_fixed(summaries_per_anchor=4), "interval", monotone=False, encoder=False),
        "abca_fixed_global_p2": sized(_global(_fixed(summaries_per_anchor=2)), "interval", monotone=False,
                                      encoder=False),
    },
    decoder=Decoder(decode.init_cache, decode.step),
    keys_per_query=abca_keys,
    bench={"abca": bench_core, "abca_random": lambda spec: bench_core(spec, random_zones=True)},
)
