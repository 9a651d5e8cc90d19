"""Non-crossing routing attention (`modules.noncrossing`): Temperley–Lieb diagrams from a router's generator words;
bidirectional only (the classifier), one preset per router."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.modules.noncrossing import NoncrossingAttention, NoncrossingAttentionConfig
from sparse_attn.registry import BenchCore, Mechanism, Preset
from sparse_attn.studies.bench import BenchSpec, qkv

ROUTERS = {"defect": "defect_pair", "brick": "brick_wall", "adjacent": "adjacent_topk"}

def bench_core(spec: BenchSpec) -> BenchCore:
    """The module's `core` with the defect-pair router (features, diagrams, key rows [self, top, bottom],
    attention; projections excluded), bidirectional; forward+backward also differentiates the router's input."""
    if spec.causal:
        raise ValueError("non-crossing routing attention is bidirectional only: run its core with causal=False")
    cfg = NoncrossingAttentionConfig(router="defect_pair", implementation=spec.impl, rope_base=None)
    module = cfg.make(spec.heads * spec.head_dim, spec.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    x = jax.random.normal(jax.random.fold_in(spec.key, 1), (spec.batch, spec.n, spec.heads * spec.head_dim),
                          spec.dtype)  # fmt: skip
    valid = jnp.full((spec.batch,), spec.n, jnp.int32)

    def fn(q, k, v, x, params):
        o, stats = nnx.merge(graphdef, params).core(x, q, k, v, valid)
        return o, stats["keys_per_query"] * spec.n

    return BenchCore(fn, (*qkv(spec), x, params), grad_argnums=(0, 1, 2, 3))


RECORD = Mechanism(
    name="noncrossing",
    configs=(NoncrossingAttentionConfig,),
    module=NoncrossingAttention,
    presets={f"noncrossing_{short}": Preset(config=lambda ctx, r=router: NoncrossingAttentionConfig(router=r),
                                            causal=False)
             for short, router in ROUTERS.items()},
    bench={"noncrossing": bench_core},
)
