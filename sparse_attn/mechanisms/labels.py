"""Label-intersection attention (`modules.labels`): the runner's default and the budget grids' presets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.decode import labels as decode
from sparse_attn.diagnostics.probe import label_probe
from sparse_attn.mechanisms.common import sized
from sparse_attn.modules.labels import (
    INFERENCE_STEP,
    LabelAttention,
    LabelAttentionConfig,
    LabelCapacity,
    LabelRouterConfig,
    label_core,
)
from sparse_attn.patterns.labels import position
from sparse_attn.patterns.labels.stats import p_share
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.registry import BenchCore, Decoder, Mechanism, Preset
from sparse_attn.studies.bench import BenchSpec, qkv


def label_keys(cfg: LabelAttentionConfig, n: int, tokens_BxN=None) -> float:
    """The budget convention (the pattern depends on the router): the *expected* count under independent uniform
    k-of-d labels, 1 + (keys of the base graph H besides self) x p_share(d, k), H's causal keys in closed form (O(n)):
    the window [u - radius, u] and the landmarks (multiples of the stride) before the window. Position labels' near
    pairs are always kept and counted exactly."""
    every = cfg.landmarks
    u = np.arange(n)
    window = np.minimum(u, cfg.radius) + 1
    before = u - cfg.radius - 1  # the last position left of the window
    landmarks = np.where(before >= 0, before // every + 1, 0) if every else np.zeros(n, np.int64)
    others = float(np.mean(window + landmarks)) - 1.0
    near = _position_keys(cfg, n) if cfg.position_cell else 0.0
    return 1.0 + near + (others - near) * p_share(cfg.num_labels, cfg.top_k)


def _position_keys(cfg: LabelAttentionConfig, n: int) -> float:
    """Mean causal window keys (self excluded) that share a position label with their query: always allowed. (A
    landmark beyond the window whose cell number matches is counted at p_share like the other landmarks.)"""
    lab = np.asarray(position.position_labels(jnp.arange(n), cfg.position_cell, cfg.radius, 0))  # [N, 2]
    total = 0
    for d in range(1, min(cfg.radius, n - 1) + 1):
        total += int(np.sum(np.any(lab[d:] == lab[:-d], axis=-1)))
    return total / n


_STOP_GRADIENT = LabelRouterConfig(input_gradient=False)  # the router reads stop_gradient(x)


def _capacity(n: int) -> LabelCapacity:
    """Bucket blocks of at most 128 entries (64 in the soft phases), no larger than the sequence."""
    return LabelCapacity(block=min(128, n), soft_block=min(64, n))


def _labels(d: int, k: int, cell: int = 0, every: int | None = None, **kw) -> Preset:
    """d labels, top-k, landmarks every `radius` tokens (about one per window) unless `every` fixes the stride.
    Keys per query are not monotone in the radius (a small radius multiplies the landmarks): every radius is
    measured."""
    return sized(lambda w, n, t: LabelAttentionConfig(num_labels=d, top_k=k, radius=w,
                                                      landmark_every=w if every is None else every,
                                                      position_cell=cell, capacity=_capacity(n), **kw),
                 "radius", monotone=False)


def bench_core(spec: BenchSpec) -> BenchCore:
    """The router and the hard-phase `label_core` at inference: a window of `spec.radius`, no landmarks, 3 of 32
    labels a token, the spec's executor for the label pattern; the router's input and parameters are arguments."""
    cfg = LabelAttentionConfig(num_labels=32, top_k=3, radius=spec.radius, landmark_every=0, phase="hard",
                               implementation=spec.impl, rope_base=None, capacity=_capacity(spec.n))
    module = cfg.make(spec.heads * spec.head_dim, spec.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module.router, nnx.Param)
    base = BaseGraph(radius=spec.radius, landmark_every=0, causal=spec.causal)
    x = jax.random.normal(jax.random.fold_in(spec.key, 1), (spec.batch, spec.n, spec.heads * spec.head_dim),
                          spec.dtype)  # fmt: skip
    valid = jnp.full((spec.batch,), spec.n, jnp.int32)

    def fn(q, k, v, x, params):
        r = nnx.merge(graphdef, params)(x)
        o, aux = label_core(q, k, v, r, cfg, base, step=jnp.int32(INFERENCE_STEP), valid_len=valid)
        return o, jnp.mean(jnp.sum(aux["hard_keys"], axis=-1, dtype=jnp.float32))

    return BenchCore(fn, (*qkv(spec), x, params))


RECORD = Mechanism(
    name="labels",
    configs=(LabelAttentionConfig,),
    module=LabelAttention,
    presets={
        # The module's defaults (32 labels, top-2): the runners' label attention.
        "labels": Preset(config=lambda ctx: LabelAttentionConfig(radius=ctx.window, capacity=_capacity(ctx.seq_len))),
        # The budget grids' presets: 8 labels unless the name says otherwise.
        "labels_d8k2": _labels(8, 2),
        "labels_d16k2": _labels(16, 2),
        "labels_d8k1": _labels(8, 1),
        "labels_d4k1": _labels(4, 1),
        "labels_pos": _labels(8, 2, cell=8),  # + position labels: pairs closer than 4 always kept
        "labels_lm4": _labels(8, 2, every=4),  # a landmark every 4 tokens: each relays the few tokens just before it
        "labels_st": _labels(8, 2, phase="straight_through"),  # the hard forward pass from the first step
        # the hard pattern throughout with the router frozen at its initialisation: a random label filter
        "labels_hard": _labels(8, 2, phase="hard"),
        # the router reading stop_gradient(x): it learns, but moves no representation
        "labels_sg": _labels(8, 2, router=_STOP_GRADIENT),
        "labels_st_sg": _labels(8, 2, phase="straight_through", router=_STOP_GRADIENT),
        "labels_pos_sg": _labels(8, 2, cell=8, router=_STOP_GRADIENT),
    },
    decoder=Decoder(decode.init_cache, decode.step),
    probe=label_probe,
    keys_per_query=label_keys,
    bench={"labels": bench_core},
)
