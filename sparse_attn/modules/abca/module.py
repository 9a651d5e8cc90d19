"""AnchorAttention (NNX): placement -> zones -> the ABCA core -> output projection, with aux loss and statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.modules.abca.config import AnchorAttentionConfig, ExplicitAnchors, FixedAnchors, LearnedAnchors
from sparse_attn.modules.abca.core import run_abca_core
from sparse_attn.modules.abca.stats import abca_stats
from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections
from sparse_attn.patterns import abca


class AnchorAttention(nnx.Module):
    """ABCA layer. Call as `module(x_BxNxD, ctx, anchor_mask=None) -> AttentionOutput`."""

    def __init__(self, config: AnchorAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        h, d = num_heads, self.proj.head_dim
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.anchor_wq = nnx.Param(init(rngs.params(), (h, d, d)))
        self.anchor_wk = nnx.Param(init(rngs.params(), (h, d, d)))
        # Values start as the identity: an anchor's zone value is its (post-handshake) state.
        self.anchor_wv = nnx.Param(jnp.broadcast_to(jnp.eye(d), (h, d, d)))
        # Pooled writes: the extra summaries' gather-query maps, random so that the summaries start apart.
        extra = config.summaries_per_anchor - 1
        self.summary_wq = nnx.data(None)
        if extra:
            summary_init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0, 1))
            self.summary_wq = nnx.Param(summary_init(rngs.params(), (extra, h, d, d)))
        self.score = nnx.data(None)
        if isinstance(config.placement, LearnedAnchors):
            bias_init = nnx.initializers.constant(config.placement.score_bias_init)
            self.score = nnx.data(nnx.Linear(model_dim, 1, bias_init=bias_init, rngs=rngs))

    def _placement(self, x_BxNxD, ctx: AttentionContext, anchor_mask):
        cfg, place = self.config, self.config.placement
        b, n = x_BxNxD.shape[:2]
        scores = aux = None
        if isinstance(place, ExplicitAnchors):
            if anchor_mask is not None:
                raw = abca.explicit_anchors(anchor_mask)
                if raw.shape != (b, n):
                    raise ValueError(f"anchor_mask {raw.shape} does not match the input's [B, N] = {(b, n)}")
            elif ctx.tokens is not None and place.anchor_id is not None:
                if ctx.tokens.shape != (b, n):
                    raise ValueError(f"ctx.tokens {ctx.tokens.shape} does not match the input's [B, N] = {(b, n)}")
                raw = abca.explicit_anchors(tokens_BxN=ctx.tokens, anchor_id=place.anchor_id,
                                            vocab_size=place.vocab_size)
            else:
                raise ValueError("explicit placement needs anchor_mask, or ctx.tokens and placement.anchor_id")
        elif isinstance(place, FixedAnchors):
            raw = abca.fixed_interval_anchors(b, n, place.interval)
        else:
            scores = self.score(x_BxNxD)[..., 0].astype(jnp.float32)  # a per-token head: placement stays causal
            raw = abca.learned_anchors(scores)
            if place.boundary_ids and ctx.tokens is not None:
                target = jnp.isin(ctx.tokens, jnp.asarray(place.boundary_ids, ctx.tokens.dtype))
                aux = place.loss_weight * abca.placement_loss(scores, target, ctx.valid_len)
        is_anchor, inserted = abca.enforce_zone_cap(raw, ctx.valid_len, cfg.max_zone)
        gate = None
        if scores is not None and place.straight_through:
            gate = abca.straight_through_gate(scores, is_anchor)
        return is_anchor, inserted, gate, aux

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext, *, anchor_mask=None) -> AttentionOutput:
        cfg = self.config
        if x_BxNxD.ndim != 3:
            raise ValueError(f"x must be [B, N, model_dim], got shape {x_BxNxD.shape}")
        if ctx.valid_len.shape != x_BxNxD.shape[:1]:
            raise ValueError(f"ctx.valid_len {ctx.valid_len.shape} does not match batch {x_BxNxD.shape[0]}")
        live = (jnp.arange(x_BxNxD.shape[1])[None] < ctx.valid_len[:, None])[..., None]
        # Padded hidden states may hold anything (NaN included): select them away once, so that neither the
        # projections' weight gradients (x^T dq) nor the score head ever multiply them.
        x_BxNxD = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
        is_anchor, inserted, gate, aux = self._placement(x_BxNxD, ctx, anchor_mask)
        zones = abca.compute_zones(is_anchor, ctx.valid_len)
        q, k, v = self.proj.qkv(x_BxNxD)
        anchor_proj = AnchorProjections(
            self.anchor_wq[...], self.anchor_wk[...], self.anchor_wv[...], rope_base=cfg.rope_base
        )
        o, info = run_abca_core(
            q,
            k,
            v,
            zones,
            anchor_proj,
            max_zone=cfg.max_zone,
            causal=ctx.causal,
            handshake=cfg.handshake,
            handshake_steps=cfg.handshake_steps,
            max_anchors=cfg.max_anchors,
            gate_BxN=gate,
            scale=None,
            implementation=cfg.implementation,
            slot_width=cfg.slot_width,
            summary_wq=None if self.summary_wq is None else self.summary_wq[...],
        )
        y = jnp.where(live, self.proj.out(o), 0.0).astype(x_BxNxD.dtype)
        stats = abca_stats(
            zones,
            inserted,
            info,
            causal=ctx.causal,
            handshake=cfg.handshake,
            handshake_steps=cfg.handshake_steps,
            max_anchors=cfg.max_anchors,
            slot_width=cfg.slot_width or cfg.max_zone,  # used when the core reports `slots_used` ("packed")
            summaries_per_anchor=cfg.summaries_per_anchor,
        )
        stats = jax.tree.map(jax.lax.stop_gradient, stats)
        aux_losses = {} if aux is None else {"placement": aux}
        return AttentionOutput(y=y, aux_losses=aux_losses, stats=stats)

