"""Per layer and head of a trained model: is the pair a task needs in the layer's pattern, and how much attention
does it get (`retrieval.pattern_recall`, `retrieval.pair_attention_mass`)?

    rows = retrieval_probe(model, tokens_BxN, q_pos_BxP, k_pos_BxP, step=step)
    rows[i]["recall"], rows[i]["mass"]   # float32[B, H, P] of layer i (None where its module has no probe)
    rows[i]["uniform_mass"]              # the mass a query that knows nothing (q = 0) would put there

ABCA layers (several softmaxes: gather, handshake, zones) report their information path instead
(`diagnostics.abca`): recall = the pair lies on a route of the layer, mass = the layer's flow from the key to the
query, and each hop's weight (`direct`, `to_anchor`, `gather`, `handshake`, with their `*_uniform`).

    attention_rollout(model, tokens_BxN, q_pos_BxP, k_pos_BxP)  # {"rollout", "rollout_uniform"} float32[B, P]

is the whole model's flow from the key to the query (every layer's heads averaged, rollout as in `diagnostics.abca`):
for tasks whose answer needs two hops across layers, where no single layer admits the pair.

A probe, `(module, x_BxNxD, ctx) -> (q, k, pattern, implementation)`, gives a layer's queries and keys from its
normed input and the single-softmax pattern it attends; each mechanism's record names its probe
(`sparse_attn.registry.Mechanism.probe`). Defined here: the fixed patterns' (`pattern_probe`), MoBA's (its
selection's layout) and label attention's (its *hard* pattern, the router's top-k labels: what it attends at
inference, and from the straight-through phase on in training).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sparse_attn import registry
from sparse_attn.diagnostics.abca import abca_hops, abca_maps, layer_flow, softmax_weights
from sparse_attn.diagnostics.retrieval import check_positions, pair_attention_mass, pattern_recall
from sparse_attn.models.transformer import TransformerLM
from sparse_attn.modules.abca import AnchorAttention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import LabelAttention
from sparse_attn.modules.moba import MobaAttention, moba_layout, moba_selection
from sparse_attn.modules.pattern_attention import PatternAttention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import position
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

def probe_for(module) -> Callable[..., tuple] | None:
    """The probe of `module`'s mechanism (None: its record has none)."""
    record = registry.for_module(module)
    return None if record is None else record.probe


def layer_inputs(model: TransformerLM, tokens_BxN, *, valid_len=None, step=0) -> tuple[list, AttentionContext]:
    """(the normed input of every layer's attention, the context it ran with): the model's trunk, replayed."""
    b, n = tokens_BxN.shape
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.asarray(valid_len, jnp.int32)
    ctx = AttentionContext(valid_len=vl, tokens=tokens_BxN, step=jnp.asarray(step, jnp.int32), causal=True)
    x, inputs = model.embed(tokens_BxN), []
    for block in model.blocks:
        inputs.append(block.norm1(x))
        x, _ = block(x, ctx)
    return inputs, ctx


def retrieval_probe(model: TransformerLM, tokens_BxN, q_pos_BxP, k_pos_BxP, *, valid_len=None, step=0) -> list:
    """[{"recall", "mass", "uniform_mass"} float32[B, H, P] per layer, or None for a layer without a probe]."""
    inputs, ctx = layer_inputs(model, tokens_BxN, valid_len=valid_len, step=step)
    rows = []
    for block, x in zip(model.blocks, inputs, strict=True):
        if isinstance(block.attn, AnchorAttention):
            hops = abca_hops(abca_maps(block.attn, x, ctx), q_pos_BxP, k_pos_BxP,
                             abca_maps(block.attn, x, ctx, uniform=True))  # fmt: skip
            rows.append({"recall": (hops["flow_uniform"] > 0).astype(jnp.float32), "mass": hops["flow"],
                         "uniform_mass": hops["flow_uniform"], **hops})  # fmt: skip
            continue
        probe = probe_for(block.attn)
        if probe is None:
            rows.append(None)
            continue
        q, k, pattern, implementation = probe(block.attn, x, ctx)
        recall = pattern_recall(pattern, q_pos_BxP, k_pos_BxP)
        mass = pair_attention_mass(q, k, pattern, q_pos_BxP, k_pos_BxP, implementation=implementation)
        uniform = pair_attention_mass(jnp.zeros_like(q), k, pattern, q_pos_BxP, k_pos_BxP,
                                      implementation=implementation)  # fmt: skip
        rows.append({"recall": jnp.broadcast_to(recall, mass.shape), "mass": mass, "uniform_mass": uniform})
    return rows


def layer_weights(block_attn, x, ctx, *, uniform: bool = False) -> jax.Array | None:
    """float32[B, H, N, N]: the layer's token -> token weights (ABCA: its flow), None without a probe."""
    if isinstance(block_attn, AnchorAttention):
        return layer_flow(abca_maps(block_attn, x, ctx, uniform=uniform))
    probe = probe_for(block_attn)
    if probe is None:
        return None
    q, k, pattern, _ = probe(block_attn, x, ctx)
    mask = jnp.broadcast_to(pattern.to_dense(), (q.shape[0], q.shape[2]) + (q.shape[1],) * 2)
    return softmax_weights(q, k, mask, 1.0 / math.sqrt(q.shape[-1]), uniform=uniform)


def attention_rollout(model: TransformerLM, tokens_BxN, q_pos_BxP, k_pos_BxP, *, valid_len=None,
                      step=0) -> dict | None:  # fmt: skip
    """{"rollout", "rollout_uniform"}: float32[B, P], the model's flow from key k_pos to query q_pos through every
    layer (0.5 I + 0.5 of the head-averaged weights per layer); None if a layer has no probe."""
    n = tokens_BxN.shape[1]
    q_pos, k_pos = check_positions("q_pos", q_pos_BxP, n), check_positions("k_pos", k_pos_BxP, n)
    inputs, ctx = layer_inputs(model, tokens_BxN, valid_len=valid_len, step=step)
    eye = jnp.eye(n, dtype=jnp.float32)[None]
    out = {}
    for name, uniform in (("rollout", False), ("rollout_uniform", True)):
        r = jnp.broadcast_to(eye, (tokens_BxN.shape[0], n, n))
        for block, x in zip(model.blocks, inputs, strict=True):
            w = layer_weights(block.attn, x, ctx, uniform=uniform)
            if w is None:
                return None
            r = jnp.einsum("bij,bjk->bik", 0.5 * eye + 0.5 * jnp.mean(w, axis=1), r,
                           precision=jax.lax.Precision.HIGHEST)  # fmt: skip
        q_b = jnp.broadcast_to(q_pos, (r.shape[0], q_pos.shape[1]))
        k_b = jnp.broadcast_to(k_pos, (r.shape[0], k_pos.shape[1]))
        out[name] = jax.vmap(lambda m, qi, ki: m[qi, ki])(r, q_b, k_b)
    return out


def pattern_probe(module: PatternAttention, x, ctx):
    q, k, _ = module.proj.qkv(x)
    return q, k, module.config.pattern(x.shape[1], ctx), module.config.implementation


def moba_probe(module: MobaAttention, x, ctx):
    cfg = module.config
    q, k, _ = module.proj.qkv(x)
    causal = ctx.causal or cfg.causal
    sel = moba_selection(q, k, cfg, causal=causal, valid_len=ctx.valid_len)
    # per-head random blocks: the "xla" executor refuses them (modules/selected_blocks.py)
    return q, k, moba_layout(sel, x.shape[1], cfg, causal=causal, valid_len=ctx.valid_len), "reference"


def label_probe(module: LabelAttention, x, ctx):
    cfg = module.config
    live = jnp.arange(x.shape[1])[None, :, None] < ctx.valid_len[:, None, None]
    x = jnp.where(live, x, jnp.zeros((), x.dtype))  # as the module does before projecting
    q, k, _ = module.proj.qkv(x)
    labels = bits_lib.top_k_labels(module.router(x), cfg.top_k)
    total = cfg.num_labels
    if cfg.position_cell:
        p = jnp.zeros(labels.shape[:-1] + (cfg.num_labels,), jnp.float32)  # memberships: unused by the pattern
        labels, _, total = position.with_position_labels(labels, p, cfg.position_cell, cfg.radius)
    base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmarks, causal=ctx.causal)
    pattern = LabelPattern.from_labels(labels, total, base=base, valid_len=ctx.valid_len)
    return q, k, pattern, "reference"

