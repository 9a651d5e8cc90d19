"""Equal attention budgets for the causal LM: a preset's config for a target number of allowed keys per query
(allowed (query, key) pairs / tokens, self included; causal dense has (n + 1) / 2).

    attention_for_budget("labels_d8k2", n=256, keys_per_query_target=24)   # -> LabelAttentionConfig(radius=53, ...)

Each mechanism's record says how its presets are sized (`sparse_attn.registry.Preset.budget`, the tuned integer)
and how its keys per query are counted on full length-n sequences (`Mechanism.keys_per_query`):
* dense, local, Longformer, BigBird: exactly, `patterns.pattern_stats` of the layer's pattern.
* ABCA: exactly for the anchors it gets (anchor gather + zones + every handshake step). Explicit (newline) anchors
  depend on the text: counted on `tokens` (windows of the corpus); only the zone cap `max_zone` is tunable, so a
  budget above what the lines give cannot be met (an error says so). Learned placement: counted as before
  training, when the score head places no anchor and the cap inserts one every `max_zone` tokens; trained anchors
  can only shorten zones, so this is the learned run's upper bound, and its measured `keys_per_query` during
  training is in the results.
* Labels (landmarks every `radius`, counted in H in closed form): the pattern depends on the router. The
  convention is the *expected* count under independent uniform k-of-d labels: 1 + (keys of the base graph H
  besides self) x P(two tokens share a label), P = 1 - C(d-k, k) / C(d, k) (`patterns.labels.stats.p_share`).
  A trained router correlates neighbours' labels, so the trained count differs; the training statistics report it
  (`layer{i}/keys_per_query`). `tests/experiments/test_lm_grid.py` checks the convention against the dense mask of
  random labels.
* MoBA and NSA: in closed form (they do not depend on what the gate picks).

`budget_names()` lists what a grid can run: dense (the reference, never matched) and every preset with a budget.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from sparse_attn import registry
from sparse_attn.modules import DenseAttention

TOLERANCE = 0.10  # matched budgets lie within 10% of the target


# The config fields a results row records (and the tables show): every preset's tuned and defining parameters, by
# their flat names (a grouped config gives them through `flat_fields()`).
RECORDED_FIELDS = ("radius", "interval", "max_zone", "block", "num_labels", "top_k", "landmark_every", "position_cell",
                   "phase", "handshake", "handshake_steps", "placement", "block_size", "compress_block",
                   "compress_stride", "select_block", "top_n", "window", "router_input_gradient",
                   "summaries_per_anchor")


def recorded_fields(att) -> dict:
    """{field: value} of `RECORDED_FIELDS` that the config `att` has: what a row says of its attention."""
    flat = att.flat_fields() if hasattr(att, "flat_fields") else {f: getattr(att, f) for f in RECORDED_FIELDS
                                                                    if hasattr(att, f)}
    return {f: flat[f] for f in RECORDED_FIELDS if f in flat}


def budget_names() -> tuple[str, ...]:
    """What a budget grid can run, in registration order: dense (the reference) and every budget-matched preset."""
    return ("dense",) + registry.preset_names(budget=True)


def check_budget_name(name: str) -> str:
    """`name` if a budget grid can run it, else a ValueError listing what can."""
    if name not in budget_names():
        raise ValueError(f"unknown --mechanism {name!r} for a budget grid; choose from {', '.join(budget_names())}")
    return name


def keys_per_query(att, n: int, tokens_BxN=None) -> float:
    """Allowed keys per query of one causal layer on full length-n sequences (its mechanism's count)."""
    count = registry.for_config(att).keys_per_query
    if count is None:
        raise ValueError(f"{type(att).__name__}'s mechanism counts no keys per query (Mechanism.keys_per_query)")
    return count(att, n, tokens_BxN)


def attention_for_budget(name: str, *, n: int, keys_per_query_target: float, tokens_BxN=None):
    """The config of preset `name` whose keys per query is closest to the target (dense: the dense layer).

    Raises ValueError when no size brings it within `TOLERANCE` of the target.
    """
    check_budget_name(name)
    if name == "dense":
        return DenseAttention()
    preset = registry.preset(name)[1]

    @functools.cache
    def measure(p: int) -> float:
        try:
            att = preset.budget(p, n, keys_per_query_target)
        except ValueError:  # a size too large for the config (position labels that outgrow the bitmasks)
            return math.inf
        return keys_per_query(att, n, tokens_BxN)

    best = (_closest_monotone if preset.monotone else _closest_right_of_minimum)(measure, max(n - 1, 1),
                                                                                   keys_per_query_target)
    got = measure(best)
    if abs(got - keys_per_query_target) > TOLERANCE * keys_per_query_target:
        raise ValueError(f"{name}: no {preset.tuned} gives {keys_per_query_target:g} keys per query at n={n} "
                         f"(closest: {got:.1f} at {preset.tuned}={best}); pick another budget or mechanism")
    return preset.budget(best, n, keys_per_query_target)


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
