"""What a classification run measures: weighted accuracy (per distance bucket), attention FLOPs, training FLOPs.

Evaluation returns *sums* per batch (the loop averages them over batches, so ratios of them are exact):
`correct` and `count` weight out the filler rows `eval_batches` appends (`weight` 0), so the accuracy is over
real examples only. Attention statistics are taken from full batches only (`full` = 1 when no row is filler).

FLOPs (the research documents' "loss per training FLOP"):
* dense parts: 6 * params * tokens per step (forward 2, backward 4 per parameter per token; every position of
  the padded sequence runs through the projections and MLPs). Embedding and head parameters are excluded
  (a lookup, and a head applied once per sequence).
* attention: 3 * forward attention FLOPs (backward ~2x forward), forward = 4 * head_dim * (attended query-key
  pairs) summed over heads: QK^T and PV, 2 FLOPs per multiply-add. Pairs come from the common statistic every
  attention layer reports, `keys_per_query` (mean over valid queries and heads, docs/architecture.md,
  "Statistics"): pairs = keys_per_query * heads * valid tokens, for baselines and mechanisms alike (ABCA counts
  every pass, labels the pattern of the phase evaluated, i.e. the hard one, non-crossing self + routed partners).
  These are the pattern's algorithmic FLOPs, not what an executor runs (a dense reference executor computes
  every pair and masks). Measured on the validation set at each evaluation; training batches are drawn from
  the same generator, so the expected count per example is the same.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True, kw_only=True)
class Buckets:
    """Accuracy per bucket of an int field: bucket i holds `edges[i] <= field < edges[i+1]`."""

    field: str
    edges: tuple[int, ...]

    def labels(self) -> tuple[str, ...]:
        return tuple(f"{lo}-{hi - 1}" for lo, hi in zip(self.edges[:-1], self.edges[1:], strict=True))


def listops_buckets() -> Buckets:
    """Operator nesting depth 1..9."""
    return Buckets(field="depth", edges=(1, 3, 5, 7, 10))


def dyck_buckets(n: int, min_distance: int = 16) -> Buckets:
    """Probe distance in powers of two from `min_distance` up to the sequence length."""
    edges = [min_distance]
    while edges[-1] * 2 < n:
        edges.append(edges[-1] * 2)
    return Buckets(field="distance", edges=(*edges, n + 1))


def layer_attention_flops(stats: dict, *, valid_len_B, heads: int, head_dim: int):
    """Forward attention FLOPs of one layer on one batch, summed over examples and heads (float32 scalar).

    `stats`: the layer's statistics without the `layer{i}/` prefix (as the model reports them); their common
    `keys_per_query` is the mean over valid queries and heads, so pairs = keys_per_query * heads * valid tokens.
    """
    if "keys_per_query" not in stats:
        raise ValueError(f"no attention FLOP count: the layer reports no keys_per_query (stats: {sorted(stats)})")
    live = jnp.sum(jnp.asarray(valid_len_B).astype(jnp.float32))
    return 4.0 * head_dim * heads * stats["keys_per_query"] * live


def classification_loss(model, batch: dict, step):
    """Mean cross-entropy + the attention modules' weighted auxiliary losses; train metrics."""
    out = model(batch["inputs"], valid_len=batch["valid_len"], step=step)
    logits = out.logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
    return nll + out.aux_loss, {"nll": nll, "accuracy": acc, "aux_loss": out.aux_loss, **out.stats}


def make_eval_fn(model_config, n: int, buckets: Buckets | None):
    """`eval_fn(model, batch, step) -> sums` for the loop, at the train state's step; `summarize` turns their
    batch means into metrics."""
    num_layers = len(model_config.layer_attention())
    heads, head_dim = model_config.num_heads, model_config.model_dim // model_config.num_heads

    def eval_fn(model, batch: dict, step) -> dict:
        out = model(batch["inputs"], valid_len=batch["valid_len"], step=step)
        logits = out.logits.astype(jnp.float32)
        w = batch["weight"].astype(jnp.float32)
        correct = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32) * w
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * w
        full = jnp.all(batch["weight"] == 1).astype(jnp.float32)
        vl = batch["valid_len"]
        m = {"correct": correct.sum(), "count": w.sum(), "nll_sum": nll.sum(), "full": full,
             "full_examples": full * w.shape[0], "live_tokens": full * jnp.sum(vl.astype(jnp.float32))}
        if buckets is not None:
            field = batch[buckets.field]
            for label, lo, hi in zip(buckets.labels(), buckets.edges[:-1], buckets.edges[1:], strict=True):
                inside = ((field >= lo) & (field < hi)).astype(jnp.float32) * w
                m[f"correct/{label}"] = jnp.sum(correct * inside)
                m[f"count/{label}"] = jnp.sum(inside)
        dense = 4.0 * head_dim * heads * jnp.sum(vl.astype(jnp.float32) ** 2)
        for i in range(num_layers):
            prefix = f"layer{i}/"
            stats = {k[len(prefix):]: v for k, v in out.stats.items() if k.startswith(prefix)}
            flops = layer_attention_flops(stats, valid_len_B=vl, heads=heads, head_dim=head_dim)
            m[f"{prefix}attn_fwd_flops"] = full * flops
            m[f"{prefix}dense_fwd_flops"] = full * dense
            for k, v in stats.items():
                if jnp.ndim(v) == 0:
                    m[f"{prefix}stat/{k}"] = full * v
        return m

    return eval_fn


def summarize(means: dict, buckets: Buckets | None, *, heads: int, head_dim: int) -> dict:
    """Batch means of `eval_fn`'s sums -> accuracy, loss, per-bucket accuracy, per-layer attention numbers."""
    nan = float("nan")
    ratio = lambda a, b: float(a) / float(b) if b else nan  # noqa: E731
    out = {"accuracy": ratio(means["correct"], means["count"]), "valid_loss": ratio(means["nll_sum"], means["count"])}
    if buckets is not None:
        out["accuracy_by_bucket"] = {
            label: {"accuracy": ratio(means[f"correct/{label}"], means[f"count/{label}"]),
                    "fraction": ratio(means[f"count/{label}"], means["count"])}
            for label in buckets.labels()
        }
    layers = sorted({k.split("/")[0] for k in means if k.startswith("layer")}, key=lambda s: int(s[5:]))
    per_layer = []
    for name in layers:
        fwd = ratio(means[f"{name}/attn_fwd_flops"], means["full_examples"])
        per_layer.append({
            "attn_fwd_flops_per_example": fwd,
            "attn_vs_dense": ratio(means[f"{name}/attn_fwd_flops"], means[f"{name}/dense_fwd_flops"]),
            "keys_per_query": ratio(means[f"{name}/attn_fwd_flops"], means["live_tokens"] * 4.0 * head_dim * heads),
            "stats": {k.split("/stat/", 1)[1]: ratio(v, means["full"]) for k, v in means.items()
                      if k.startswith(f"{name}/stat/")},
        })
    out["layers"] = per_layer
    out["attn_fwd_flops_per_example"] = sum(layer["attn_fwd_flops_per_example"] for layer in per_layer)
    return out


def training_flops(*, param_count: int, embed_params: int, head_params: int, global_batch: int, seq_len: int,
                   attn_fwd_flops_per_example: float) -> dict:
    """FLOPs of one training step: 6 * params * tokens (dense parts) + 3 * forward attention FLOPs."""
    dense = 6.0 * (param_count - embed_params - head_params) * global_batch * seq_len
    attn = 3.0 * attn_fwd_flops_per_example * global_batch
    return {"dense_per_step": dense, "attention_per_step": attn, "per_step": dense + attn}
