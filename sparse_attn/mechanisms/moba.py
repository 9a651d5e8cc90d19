"""MoBA (`modules.moba`, Lu et al. 2025, arXiv 2502.13189): the own key block plus the top-k blocks by q · mean(K)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from sparse_attn.decode import moba as decode
from sparse_attn.diagnostics.probe import moba_probe
from sparse_attn.mechanisms.common import sized
from sparse_attn.modules.moba import MobaAttention, MobaAttentionConfig, moba_core, moba_selection, moba_stats
from sparse_attn.registry import BenchCore, Decoder, Mechanism, Preset
from sparse_attn.studies.bench import BenchSpec, qkv


def moba_keys(cfg: MobaAttentionConfig, n: int, tokens_BxN=None) -> float:
    """Causal keys per query on full sequences, whatever the gate picks: the own block up to the query plus
    min(top_k - 1, earlier blocks) whole earlier blocks."""
    bs = cfg.block_size
    i = np.arange(n)
    own = i - (i // bs) * bs + 1
    return float(np.mean(own + np.minimum(cfg.top_k - 1, i // bs) * bs))


def moba_unit(target: float) -> int:
    """A budget's block size is tuned in units of 1 below 64 keys a query and of 16 from 64 on, so that a matched
    layout tiles by 16 (the smallest "pallas" tile on a GPU) where GPUs run it."""
    return 16 if target >= 64 else 1


def _budget(u: int, n: int, t: float) -> MobaAttentionConfig:
    unit = moba_unit(t)
    return MobaAttentionConfig(block_size=u * unit, top_k=3, causal=True, tile=16 if unit == 16 else None)


def bench_config(n: int, implementation: str | None = None, causal: bool = True) -> MobaAttentionConfig:
    """MoBA as the benchmarks run it at length n: key blocks of n / 128 (>= 16), top-4 with the own block: causally
    ~3.5 n / 128 keys a query, ~1/18 of causal dense's pairs."""
    return MobaAttentionConfig(block_size=max(n // 128, 16), top_k=4, causal=causal, implementation=implementation)


def bench_core(spec: BenchSpec) -> BenchCore:
    """The gate's selection (no gradient) and attention over it, from q, k, v (`bench_config`)."""
    cfg = bench_config(spec.n, spec.impl, spec.causal)
    vl = jnp.full((spec.batch,), spec.n, jnp.int32)

    def fn(q, k, v):
        sel = moba_selection(q, k, cfg, causal=spec.causal, valid_len=vl)
        o = moba_core(q, k, v, sel, cfg, causal=spec.causal, valid_len=vl)
        return o, moba_stats(sel, spec.n, cfg, causal=spec.causal, valid_len=vl)["keys_per_query"] * spec.n

    return BenchCore(fn, qkv(spec))


RECORD = Mechanism(
    name="moba",
    configs=(MobaAttentionConfig,),
    module=MobaAttention,
    presets={
        # Blocks of half a window, the own block plus the top-2 earlier ones (the paper's top-3); a budget tunes the
        # block size (and runs causal, tiled by 16 from 64 keys a query on).
        "moba": Preset(config=lambda ctx: MobaAttentionConfig(block_size=max(ctx.window // 2, 1), top_k=3,
                                                              implementation=ctx.implementation),
                       budget=_budget, tuned="block_size / moba_unit", sized=("block_size", "tile", "causal")),
        # One-token blocks: content top-k over single keys by q · k, top_k tuned (a runner's window sets it); for
        # budgets the top-3 of whole blocks cannot meet.
        "moba_b1": sized(lambda k, n, t: MobaAttentionConfig(block_size=1, top_k=k, causal=True), "top_k",
                         encoder=False),
    },
    decoder=Decoder(decode.init_cache, decode.step),
    probe=moba_probe,
    keys_per_query=moba_keys,
    bench={"moba": bench_core},
)
