"""NSA (`modules.nsa`, Yuan et al. 2025, arXiv 2502.11089): compressed tokens, selected blocks and a window, gated."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.decode import nsa as decode
from sparse_attn.modules.nsa import NsaAttention, NsaAttentionConfig
from sparse_attn.registry import BenchCore, Decoder, Mechanism, Preset
from sparse_attn.studies.bench import BenchSpec, qkv


def nsa_keys(cfg: NsaAttentionConfig, n: int, tokens_BxN=None) -> float:
    """Causal keys per query on full sequences, the three branches added: the compressed tokens ended by the query,
    its selected blocks (own block up to the query plus min(top_n - 1, earlier blocks) whole earlier blocks: the gate
    changes which, not how many) and the window."""
    i = np.arange(n)
    cmp = np.maximum((i + 1 - cfg.compress_block) // cfg.compress_stride + 1, 0)
    bs = cfg.select_block
    slc = i - (i // bs) * bs + 1 + np.minimum(cfg.top_n - 1, i // bs) * bs
    win = np.minimum(i, cfg.window) + 1
    return float(np.mean(cmp + slc + win))


def nsa_for_budget(window: int, n: int, target: float) -> NsaAttentionConfig:
    """NSA at a small budget, scaled down from the paper's (l = 32, d = 16, l' = 64, n = 16, w = 512 at 64k):
    stride d = ceil(3n / 2t), so the compressed branch takes about a third of the keys (~n / 2d on average);
    l = 2d (the paper's overlap); selection blocks of the largest power of two <= t / 6, top-3 (own block included,
    no forced initial or further local blocks: at a few blocks a query, forcing them leaves no choice); the window
    radius takes the rest and is the tuned parameter."""
    d = max(math.ceil(3 * n / (2 * target)), 1)
    bs = 2 ** max(int(math.log2(max(target / 6, 1))), 0)
    return NsaAttentionConfig(compress_block=2 * d, compress_stride=d, select_block=bs, top_n=3, sink_blocks=0,
                              recent_blocks=0, window=window, causal=True)


def _runner(ctx) -> NsaAttentionConfig:
    """Compressed tokens every window / 8 (blocks twice that), top-3 selection blocks of a quarter window, and a
    half window."""
    w = ctx.window
    d = max(w // 8, 1)
    return NsaAttentionConfig(compress_block=2 * d, compress_stride=d, select_block=max(w // 4, 1), top_n=3,
                              sink_blocks=0, recent_blocks=0, window=max(w // 2, 1), implementation=ctx.implementation)


def bench_config(n: int, implementation: str | None = None, causal: bool = True) -> NsaAttentionConfig:
    """NSA as the benchmarks run it at length n: compressed tokens every n / 128 (blocks twice that), selection
    blocks of n / 256 (>= 16), top-4, a window of n / 256: causally ~1/23 of causal dense's pairs at 16384."""
    d, small = max(n // 128, 1), max(n // 256, 16)
    return NsaAttentionConfig(compress_block=2 * d, compress_stride=d, select_block=small, top_n=4, sink_blocks=0,
                              recent_blocks=0, window=small, causal=causal, implementation=implementation)


def bench_core(spec: BenchSpec) -> BenchCore:
    """The three branches and their gated sum (`NsaAttention.core`, `bench_config`) from projected inputs: q, the
    selection branch's k, v, then the compression and window branches' k, v, the gates and the compression MLPs'
    parameters, all differentiated."""
    cfg = bench_config(spec.n, spec.impl, spec.causal)
    module = cfg.make(spec.heads * spec.head_dim, spec.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    vl = jnp.full((spec.batch,), spec.n, jnp.int32)

    def fn(q, k, v, kc, vc, kw, vw, gates, params):
        o, stats = nnx.merge(graphdef, params).core(q, (kc, vc), (k, v), (kw, vw), gates, vl, causal=spec.causal)
        return o, stats["keys_per_query"] * spec.n

    keys = jax.random.split(jax.random.fold_in(spec.key, 1), 5)
    more = [jax.random.normal(key, (spec.batch, spec.n, spec.heads, spec.head_dim), spec.dtype) for key in keys[:4]]
    gates = jax.nn.sigmoid(jax.random.normal(keys[4], (spec.batch, spec.n, 3, spec.heads, 1))).astype(spec.dtype)
    args = (*qkv(spec), *more, gates, params)
    return BenchCore(fn, args, grad_argnums=tuple(range(len(args))))


RECORD = Mechanism(
    name="nsa",
    configs=(NsaAttentionConfig,),
    module=NsaAttention,
    presets={
        "nsa": Preset(config=_runner, budget=nsa_for_budget, tuned="window",
                      sized=("compress_block", "compress_stride", "select_block", "window", "causal")),
    },
    decoder=Decoder(decode.init_cache, decode.step),
    keys_per_query=nsa_keys,
    bench={"nsa": bench_core},
)
