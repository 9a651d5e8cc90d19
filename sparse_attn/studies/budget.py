"""Equal attention budgets for the causal LM: each mechanism's window / zone / label parameters for a target number
of allowed keys per query (allowed (query, key) pairs / tokens, self included; causal dense has (n + 1) / 2).

    attention_for_budget("labels", n=256, keys_per_query_target=24)   # -> LabelAttentionConfig(radius=53, ...)

How each mechanism's keys per query is counted (`keys_per_query`), on full sequences of length n:
* dense, local, Longformer, BigBird: exactly, `patterns.pattern_stats` of the layer's pattern.
* ABCA: exactly for the anchors it gets (`modules.abca.stats.abca_stats`: anchor gather + zones + every handshake
  step). Fixed placement: every `interval` tokens. Explicit (newline) anchors depend on the text: counted on
  `tokens` (windows of the corpus); only the zone cap `max_zone` is tunable, so a budget above what the lines give
  cannot be met (an error says so). Learned placement: counted as before training, when the score head places no
  anchor and the cap inserts one every `max_zone` tokens; trained anchors can only shorten zones, so this is the
  learned run's upper bound, and its measured `keys_per_query` during training is in the results.
* Labels (landmarks every `radius`, counted in H in closed form): the pattern depends on the router. The
  convention is the *expected* count under independent uniform k-of-d labels: 1 + (keys of the base graph H
  besides self) x P(two tokens share a label), P = 1 - C(d-k, k) / C(d, k) (`patterns.labels.stats.p_share`).
  The balance loss pushes towards uniform buckets, but a trained router correlates neighbours' labels, so the
  trained count differs; the training statistics report it
  (`layer{i}/keys_per_query`). `tests/experiments/test_lm_grid.py` checks the convention against the dense mask of
  random labels.

Variant names (`VARIANTS`): dense, local, longformer, bigbird, labels (d = 8, k = 2), labels_d16k2, labels_d8k1,
labels_d4k1, labels_pos (d = 8, k = 2, + position labels of cell 8: pairs closer than 4 always kept; their keys
counted exactly, the rest at P), labels_lm4 (d = 8, k = 2, a landmark every 4 tokens, radius tuned), labels_st
(as labels, straight-through from the first step: no phase switch), labels_hard (as labels, the hard pattern from
the first step with the router frozen at its initialisation: a random label filter, a diagnostic), labels_sg and
labels_st_sg, labels_pos_sg (as labels, labels_st and labels_pos, the router reading stop_gradient(x): no router
gradient into the residual stream), abca (newline anchors, chain handshake, 1
step), abca_hs2 (2 handshake steps), abca_global (global handshake), abca_fixed, abca_fixed_global (fixed anchors,
global handshake), abca_fixed_p2 / abca_fixed_p4 (fixed anchors, 2 / 4 summaries per anchor: pooled writes),
abca_fixed_global_p2 (both: the global handshake and 2 summaries per anchor),
abca_learned (score head trained towards newlines), moba (block size tuned, top-3 blocks; keys counted in closed
form: they do not depend on what the gate picks), moba_b1 (one-token blocks, top_k tuned), nsa
(window tuned; compression and selection sized from the budget, `nsa_for_budget`; keys in closed form, as MoBA's).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from sparse_attn import patterns
from sparse_attn.modules import (
    AnchorAttentionConfig,
    AttentionContext,
    BigBirdAttention,
    DenseAttention,
    LabelAttentionConfig,
    LocalAttention,
    LongformerAttention,
)
from sparse_attn.modules.abca.stats import abca_stats
from sparse_attn.modules.moba import MobaAttentionConfig
from sparse_attn.modules.nsa import NsaAttentionConfig
from sparse_attn.patterns import abca
from sparse_attn.patterns.labels import position
from sparse_attn.patterns.labels.stats import p_share

NEWLINE = ord("\n")
TOLERANCE = 0.10  # matched budgets lie within 10% of the target


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compared mechanism: `build(param, n, target)` gives its config for the tuned integer parameter (window
    radius, fixed interval or zone cap) at length n and the target keys per query (BigBird sizes its random block
    from it). `monotone`: keys per query grow with the parameter (bisection finds it); label attention's do not
    (landmarks every `radius`: a small radius multiplies them), so its parameters are all measured."""

    build: Callable[[int, int, float], object]
    tuned: str
    monotone: bool = True


def _labels(d: int, k: int, cell: int = 0, every: int | None = None, **kw) -> Variant:
    # Landmarks every `radius` tokens (about one per window) unless `every` fixes the stride, stated here so the
    # count does not follow a default.
    return Variant(lambda w, n, t: LabelAttentionConfig(num_labels=d, top_k=k, radius=w,
                                                        landmark_every=w if every is None else every,
                                                        position_cell=cell, block=min(128, n),
                                                        soft_block=min(64, n), **kw), "radius", monotone=False)


def _abca(**kw) -> Variant:
    return Variant(lambda z, n, t: AnchorAttentionConfig(max_zone=z, **kw), "max_zone")


def _abca_global(**kw) -> Variant:
    # The global handshake's dense head holds 4 ceil(n / max_zone) anchors (the packed core's page default).
    return Variant(lambda z, n, t: AnchorAttentionConfig(max_zone=z, handshake="global",
                                                         max_anchors=4 * math.ceil(n / z), **kw), "max_zone")


def bigbird_block(target: float) -> int:
    """BigBird's random key block: the largest power of two <= target / 4 (the random part stays a quarter of the
    budget; the window takes the rest)."""
    return 2 ** max(int(math.log2(max(target / 4, 1))), 0)


VARIANTS: dict[str, Variant | None] = {
    "dense": None,  # the reference: not matched
    "local": Variant(lambda r, n, t: LocalAttention(radius=r), "radius"),
    "longformer": Variant(lambda r, n, t: LongformerAttention(radius=r, num_global=1), "radius"),
    "bigbird": Variant(lambda r, n, t: BigBirdAttention(radius=r, num_global=1, num_random=1,
                                                        block=min(bigbird_block(t), n)), "radius"),
    "labels": _labels(8, 2),
    "labels_d16k2": _labels(16, 2),
    "labels_d8k1": _labels(8, 1),
    "labels_d4k1": _labels(4, 1),
    "labels_pos": _labels(8, 2, cell=8),  # + position labels: pairs closer than 4 always kept
    # Issue 37: a landmark every 4 tokens, so each relays the few tokens just before it (not a whole window's).
    "labels_lm4": _labels(8, 2, every=4),
    # Issue 37: straight-through from the first step (the forward pass is the hard pattern throughout): no switch.
    "labels_st": _labels(8, 2, phase="straight_through"),
    # Issue 37's diagnosis: the hard pattern throughout, its router never trained (frozen when hard): what the label
    # filter costs with exact gradients and no router gradient into the residual stream.
    "labels_hard": _labels(8, 2, phase="hard"),
    # ... and with the router reading stop_gradient(x): it learns, but moves no representation.
    "labels_sg": _labels(8, 2, router_input_gradient=False),
    "labels_st_sg": _labels(8, 2, phase="straight_through", router_input_gradient=False),
    "labels_pos_sg": _labels(8, 2, cell=8, router_input_gradient=False),
    "abca": _abca(placement="explicit", anchor_id=NEWLINE, vocab_size=256),
    "abca_hs2": _abca(placement="explicit", anchor_id=NEWLINE, vocab_size=256, handshake_steps=2),
    "abca_global": _abca_global(placement="explicit", anchor_id=NEWLINE, vocab_size=256),
    "abca_fixed": Variant(lambda z, n, t: AnchorAttentionConfig(placement="fixed", interval=z, max_zone=z),
                          "interval"),
    "abca_learned": _abca(placement="learned", boundary_ids=(NEWLINE,)),
    # Fixed anchors with the global handshake (every anchor reads every earlier anchor): for tasks without newlines.
    "abca_fixed_global": Variant(lambda z, n, t: AnchorAttentionConfig(placement="fixed", interval=z, max_zone=z,
                                                                       handshake="global",
                                                                       max_anchors=4 * math.ceil(n / z)),
                                 "interval"),
    # Issue 37: pooled writes, P summaries per anchor (the question's softmax chooses among them); their keys are
    # counted, so the zones shrink at the same budget. Not monotone: tiny zones make every token an anchor.
    "abca_fixed_p2": Variant(lambda z, n, t: AnchorAttentionConfig(placement="fixed", interval=z, max_zone=z,
                                                                   summaries_per_anchor=2), "interval",
                             monotone=False),
    "abca_fixed_p4": Variant(lambda z, n, t: AnchorAttentionConfig(placement="fixed", interval=z, max_zone=z,
                                                                   summaries_per_anchor=4), "interval",
                             monotone=False),
    "abca_fixed_global_p2": Variant(lambda z, n, t: AnchorAttentionConfig(placement="fixed", interval=z, max_zone=z,
                                                                          handshake="global",
                                                                          max_anchors=4 * math.ceil(n / z),
                                                                          summaries_per_anchor=2), "interval",
                                    monotone=False),
    # MoBA (arXiv 2502.13189): the own block plus the top-2 of the earlier blocks by q · mean(K_block), the paper's
    # top-3; the block size is tuned.
    "moba": Variant(lambda u, n, t: MobaAttentionConfig(block_size=u * moba_unit(t), top_k=3, causal=True,
                                                        tile=16 if moba_unit(t) == 16 else None),
                    "block_size / moba_unit"),
    # MoBA with one-token blocks: content top-k over single keys by q · k, the top_k tuned; for budgets the top-3 of
    # whole blocks cannot meet (recall cpu_small at 6 keys: blocks of 2 give 5.1 keys, of 3 give 7.1).
    "moba_b1": Variant(lambda k, n, t: MobaAttentionConfig(block_size=1, top_k=k, causal=True), "top_k"),
    "nsa": Variant(lambda w, n, t: nsa_for_budget(w, n, t), "window"),
}


def moba_unit(target: float) -> int:
    """MoBA's block size is tuned in units of 1 below 64 keys a query and of 16 from 64 on, so that a matched layout
    tiles by 16 (tile 16: the smallest "pallas" tile on a GPU) where GPUs run it; the CPU cells (6-24 keys) keep
    any size and the default tile."""
    return 16 if target >= 64 else 1


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


# The config fields a results row records (and the tables show): every variant's tuned and defining parameters.
RECORDED_FIELDS = ("radius", "interval", "max_zone", "block", "num_labels", "top_k", "landmark_every", "position_cell",
                   "phase", "handshake", "handshake_steps", "placement", "block_size", "compress_block",
                   "compress_stride", "select_block", "top_n", "window", "router_input_gradient",
                   "summaries_per_anchor")


def recorded_fields(att) -> dict:
    """{field: value} of `RECORDED_FIELDS` that the config `att` has: what a row says of its attention."""
    return {f: getattr(att, f) for f in RECORDED_FIELDS if hasattr(att, f)}


def check_variant(name: str) -> str:
    """`name` if it is a budget-matched variant (`VARIANTS`), else a ValueError listing them."""
    if name not in VARIANTS:
        raise ValueError(f"unknown --variant {name!r}; choose from {', '.join(VARIANTS)}")
    return name


def _abca_keys(cfg: AnchorAttentionConfig, n: int, tokens_BxN) -> float:
    if cfg.placement == "explicit":
        if tokens_BxN is None:
            raise ValueError("explicit ABCA anchors depend on the text: pass tokens (windows of the corpus)")
        tokens = jnp.asarray(tokens_BxN, jnp.int32)
        if tokens.shape[1] != n:
            raise ValueError(f"tokens have length {tokens.shape[1]}, expected n={n}")
        raw = abca.explicit_anchors(tokens_BxN=tokens, anchor_id=cfg.anchor_id, vocab_size=cfg.vocab_size)
    elif cfg.placement == "fixed":
        raw = abca.fixed_interval_anchors(1, n, cfg.interval)
    else:  # learned, before training: no placed anchor, the cap inserts them (see the module docstring)
        raw = jnp.zeros((1, n), bool)
    b = raw.shape[0]
    valid = jnp.full((b,), n, jnp.int32)
    is_anchor, inserted = abca.enforce_zone_cap(raw, valid, cfg.max_zone)
    zones = abca.compute_zones(is_anchor, valid)
    max_anchors = cfg.max_anchors if cfg.max_anchors is not None else 4 * math.ceil(n / cfg.max_zone)
    st = abca_stats(zones, inserted, {}, causal=True, handshake=cfg.handshake, handshake_steps=cfg.handshake_steps,
                    max_anchors=max_anchors, summaries_per_anchor=cfg.summaries_per_anchor)
    return float(st["keys_per_query"])


def label_keys(cfg: LabelAttentionConfig, n: int) -> float:
    """The labels convention: 1 + (keys of H besides self) x p_share(d, k). H's causal keys in closed form (O(n)):
    the window [u - radius, u] and the landmarks (multiples of the stride) before the window."""
    every = cfg.radius if cfg.landmark_every is None else cfg.landmark_every  # None: the config's "one per window"
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


def moba_keys(cfg: MobaAttentionConfig, n: int) -> float:
    """MoBA's causal keys per query on full sequences, whatever the gate picks: the own block up to the query plus
    min(top_k - 1, earlier blocks) whole earlier blocks."""
    bs = cfg.block_size
    i = np.arange(n)
    own = i - (i // bs) * bs + 1
    return float(np.mean(own + np.minimum(cfg.top_k - 1, i // bs) * bs))


def nsa_keys(cfg: NsaAttentionConfig, n: int) -> float:
    """NSA's causal keys per query on full sequences, the three branches added: the compressed tokens ended by the
    query, its selected blocks (own block up to the query plus min(top_n - 1, earlier blocks) whole earlier
    blocks: the gate changes which, not how many) and the window."""
    i = np.arange(n)
    cmp = np.maximum((i + 1 - cfg.compress_block) // cfg.compress_stride + 1, 0)
    bs = cfg.select_block
    slc = i - (i // bs) * bs + 1 + np.minimum(cfg.top_n - 1, i // bs) * bs
    win = np.minimum(i, cfg.window) + 1
    return float(np.mean(cmp + slc + win))


def keys_per_query(att, n: int, tokens_BxN=None) -> float:
    """Allowed keys per query of one causal layer on full length-n sequences (see the module docstring)."""
    if isinstance(att, NsaAttentionConfig):
        return nsa_keys(att, n)
    if isinstance(att, MobaAttentionConfig):
        return moba_keys(att, n)
    if isinstance(att, LabelAttentionConfig):
        return label_keys(att, n)
    if isinstance(att, AnchorAttentionConfig):
        return _abca_keys(att, n, tokens_BxN)
    ctx = AttentionContext(valid_len=jnp.full((1,), n, jnp.int32), causal=True)
    return float(patterns.pattern_stats(att.pattern(n, ctx), 1)["mean_keys"])


def attention_for_budget(name: str, *, n: int, keys_per_query_target: float, tokens_BxN=None):
    """The config of variant `name` whose keys per query is closest to the target (dense: the dense layer).

    Raises ValueError when no parameter brings it within `TOLERANCE` of the target.
    """
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    variant = VARIANTS[name]
    if variant is None:
        return DenseAttention()

    @functools.cache
    def measure(p: int) -> float:
        try:
            att = variant.build(p, n, keys_per_query_target)
        except ValueError:  # a parameter too large for the config (position labels that outgrow the bitmasks)
            return math.inf
        return keys_per_query(att, n, tokens_BxN)

    best = (_closest_monotone if variant.monotone else _closest_right_of_minimum)(measure, max(n - 1, 1),
                                                                                    keys_per_query_target)
    got = measure(best)
    if abs(got - keys_per_query_target) > TOLERANCE * keys_per_query_target:
        raise ValueError(f"{name}: no {variant.tuned} gives {keys_per_query_target:g} keys per query at n={n} "
                         f"(closest: {got:.1f} at {variant.tuned}={best}); pick another budget or variant")
    return variant.build(best, n, keys_per_query_target)


def _closest_monotone(measure: Callable[[int], float], hi: int, target: float) -> int:
    """Bisection for the smallest parameter in [1, hi] reaching the target, then the closer of it and the one below."""
    lo = hi if measure(hi) < target else 1
    while lo < hi:
        mid = (lo + hi) // 2
        if measure(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return min({max(lo - 1, 1), lo}, key=lambda p: abs(measure(p) - target))


def _closest_right_of_minimum(measure: Callable[[int], float], hi: int, target: float) -> int:
    """Every parameter in [1, hi] measured; the closest to the target among those at or above the one with the
    fewest keys. (Labels: keys fall with the radius while landmarks thin out, then grow with the window; the wide-
    window side is the one label attention is meant for, and where a bisection from above lands at short n.)"""
    keys = np.array([measure(p) for p in range(1, hi + 1)])
    low = int(np.argmin(keys))
    return low + 1 + int(np.argmin(np.abs(keys[low:] - target)))


def newline_windows(data_U8: np.ndarray, n: int, num: int = 16, seed: int = 0) -> np.ndarray:
    """int32[num, n]: windows of a byte array at seeded random offsets (for explicit-anchor budgets)."""
    if data_U8.size <= n:
        raise ValueError(f"{data_U8.size} bytes hold no window of {n}")
    starts = np.random.default_rng(seed).integers(0, data_U8.size - n, size=num)
    return np.stack([data_U8[s:s + n] for s in starts]).astype(np.int32)
