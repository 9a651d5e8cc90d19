"""NSA (`modules.nsa`, Yuan et al. 2025, arXiv 2502.11089): compressed tokens, selected blocks and a window, gated."""

from __future__ import annotations

import math

import numpy as np

from sparse_attn.decode import nsa as decode
from sparse_attn.modules.nsa import NsaAttention, NsaAttentionConfig
from sparse_attn.registry import Decoder, Mechanism, Preset


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
)
