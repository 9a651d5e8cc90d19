"""Label attention's router, seen from the task: does it learn from the task, does it use its
labels, and what does its filter keep?

    label_usage(labels_BxPxNxK, num_labels, valid_len_B)      # share per label, entropy, bucket balance
    label_layer_probe(module, x_BxNxD, ctx, q_pos, k_pos)     # + the base graph's keys the labels keep, and
                                                              #   whether the pairs a task needs are in H at all
    router_gradient_norms(model, tokens, targets, mask, step) # per label layer: |grad| of the task loss and of
                                                              #   the router losses on the router's parameters

The router's only task signal is the attention: in the soft phases through the score's log q_uv term, in the
straight-through phase through the soft score's gradient, in the hard phase none (the top-k is not
differentiable). A task gradient near 0 next to a large regulariser gradient says the labels follow the balance and
sparsity losses, not the task.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sparse_attn.diagnostics.retrieval import check_positions
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import LabelAttention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern


def label_usage(labels_BxPxNxK, num_labels: int, valid_len_B=None) -> dict:
    """Per label head P: `share` float32[P, L] (fraction of live tokens' label slots on label l), `entropy`
    float32[P] (of the share, over log L: 1 = every label used equally, 0 = one label), `bucket_cv` float32[P] (std
    / mean of the bucket sizes over batch rows and labels: 0 = balanced) and `max_share` float32[P]."""
    b, p, n, k = labels_BxPxNxK.shape
    vl = jnp.full((b,), n, jnp.int32) if valid_len_B is None else jnp.asarray(valid_len_B, jnp.int32)
    live = (jnp.arange(n)[None, None, :, None] < vl[:, None, None, None]).astype(jnp.float32)
    onehot = jax.nn.one_hot(labels_BxPxNxK, num_labels, dtype=jnp.float32) * live[..., None]  # [B, P, N, K, L]
    sizes = jnp.sum(onehot, axis=(2, 3))  # [B, P, L]
    share = jnp.sum(sizes, axis=0) / jnp.maximum(jnp.sum(sizes, axis=(0, 2))[:, None], 1.0)  # [P, L]
    ent = -jnp.sum(jnp.where(share > 0, share * jnp.log(jnp.where(share > 0, share, 1.0)), 0.0), axis=-1)
    mean = jnp.mean(sizes, axis=(0, 2))
    cv = jnp.std(sizes, axis=(0, 2)) / jnp.maximum(mean, 1e-9)
    return {"share": share, "entropy": ent / jnp.log(float(num_labels)) if num_labels > 1 else jnp.zeros_like(ent),
            "bucket_cv": cv, "max_share": jnp.max(share, axis=-1)}  # fmt: skip


def kept_of_base(labels_BxPxNxK, num_labels: int, base: BaseGraph, valid_len_B) -> jax.Array:
    """float32: the share of the base graph's edges (self excluded) whose two tokens share a label."""
    n = labels_BxPxNxK.shape[2]
    edges = base.dense(n, valid_len_B) & ~jnp.eye(n, dtype=bool)[None]  # [B, N, N]
    kept = LabelPattern.from_labels(labels_BxPxNxK, num_labels, base=base, valid_len=valid_len_B).to_dense()
    kept = kept & edges[:, None]  # [B, P, N, N]
    return jnp.sum(kept) / jnp.maximum(jnp.sum(edges) * kept.shape[1], 1)


def label_layer_probe(module: LabelAttention, x_BxNxD, ctx: AttentionContext, q_pos_BxP=None, k_pos_BxP=None) -> dict:
    """The layer's hard labels (the router's top-k, as its probe in `diagnostics.probe`): `label_usage`, plus
    `kept_of_base` (float32: the share of the base graph's edges, self excluded, that share a label) and, for pairs
    (q_pos, k_pos), `base_recall` float32[B, P] (the pair is an edge of H: only then can any label admit it)."""
    cfg = module.config
    b, n, _ = x_BxNxD.shape
    live = jnp.arange(n)[None, :, None] < ctx.valid_len[:, None, None]
    x = jnp.where(live, x_BxNxD, jnp.zeros((), x_BxNxD.dtype))
    labels = bits_lib.top_k_labels(module.router(x), cfg.top_k)  # [B, P, N, K]
    out = label_usage(labels, cfg.num_labels, ctx.valid_len)
    base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmarks, causal=ctx.causal)
    out["kept_of_base"] = kept_of_base(labels, cfg.num_labels, base, ctx.valid_len)
    if q_pos_BxP is not None:
        q_pos, k_pos = check_positions("q_pos", q_pos_BxP, n), check_positions("k_pos", k_pos_BxP, n)
        out["base_recall"] = base.edges(q_pos, k_pos, ctx.valid_len).astype(jnp.float32)
    return out


def router_gradient_norms(model, tokens_BxN, targets_BxN, loss_mask_BxN, *, step) -> list[dict | None]:
    """Per layer ({"task", "aux"}: float32 global norms over the layer's router parameters of the gradient of the
    task's cross-entropy (over `loss_mask`) and of the model's aux losses; None for a layer without a router)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    mask = jnp.asarray(loss_mask_BxN, jnp.float32)

    def loss(p, which: str):
        out = nnx.merge(graphdef, p, rest)(tokens_BxN, step=step)
        ce = optax.softmax_cross_entropy_with_integer_labels(out.logits.astype(jnp.float32), targets_BxN)
        return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0) if which == "task" else out.aux_loss

    grads = {which: jax.grad(loss)(params, which) for which in ("task", "aux")}
    rows = []
    for i, block in enumerate(model.blocks):
        if not isinstance(block.attn, LabelAttention):
            rows.append(None)
            continue
        rows.append({which: optax.tree.norm(g["blocks"][i]["attn"]["router"]) for which, g in grads.items()})
    return rows
