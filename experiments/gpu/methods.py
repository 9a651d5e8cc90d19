"""What the GPU check times: the plan (sizes, budget), the patterns, and each method as a jitted fwd and fwd+bwd
(our kernels, cuDNN, the three mechanism cores, the MoBA and NSA cores); `method_list` gives them in the check's
priority order (experiments/gpu/check.py)."""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

import sparse_attn.kernels as kernels
from sparse_attn.executors.pallas import pallas_attention
from sparse_attn.attention import available_implementations, default_implementation
from sparse_attn.patterns import baselines
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.studies.mechanisms import Context, attention_config

RESULTS = os.path.join(os.path.dirname(__file__), "results")
TOL = {"float32": 2e-4, "bfloat16": 3e-2}
# The targets (speed-up vs cuDNN dense at 16k); cores are judged by their best implementation.
TARGETS = {"ours_dense": 0.8, "ours_window256": 30, "ours_labels": 20, "ours_labels_bucketed": 20,
           "ours_labels_bucketed64": 20, "ours_abca256": 40, "abca_core": 25, "labels_core": 12,
           "routing_core": 20}  # fmt: skip
CORES = ("abca", "labels", "routing")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    n: int  # the main length
    head_dims: tuple[int, ...]
    scale_lengths: tuple[int, ...]
    heads: int
    reps: int
    budget_s: float  # from the start of main(): no row starts after it
    check_reserve_s: float  # the last part of the budget, kept for correctness
    compile_limit_s: float
    window: int
    interval: int  # ABCA anchors
    label_radius: int
    check_n: int
    check_window: int
    config: kernels.KernelConfig | None
    interpret: bool


def plan(dry_run: bool, budget_s: float | None) -> Plan:
    if dry_run:
        cfg = kernels.KernelConfig(interpret=True, block_sizes=kernels.BlockSizes(block_q=32, block_k=32))
        return Plan(n=128, head_dims=(32,), scale_lengths=(256,), heads=2, reps=1,
                    budget_s=600 if budget_s is None else budget_s, check_reserve_s=0, compile_limit_s=120,
                    window=16, interval=32, label_radius=32, check_n=64, check_window=8, config=cfg,
                    interpret=True)  # fmt: skip
    return Plan(n=16384, head_dims=(64, 128), scale_lengths=(65536, 131072), heads=16, reps=10,
                budget_s=300 if budget_s is None else budget_s, check_reserve_s=70, compile_limit_s=30,
                window=256, interval=256, label_radius=1024, check_n=512, check_window=64, config=None,
                interpret=False)  # fmt: skip


# -- patterns ---------------------------------------------------------------------------------------------------


def abca_intervals(n: int, interval: int) -> Intervals:
    """ABCA's stage 1+3 intervals (anchors every `interval`)."""
    from sparse_attn.patterns import abca as abca_lib

    zones = abca_lib.compute_zones(abca_lib.fixed_interval_anchors(1, n, interval))
    return abca_lib.layer_intervals(zones, causal=True, max_zone=interval)


def random_labels(n: int, per_token: int = 3, seed: int = 0, batch: int = 1) -> np.ndarray:
    """int32[batch, n, per_token]: distinct labels of 32 drawn uniformly per token."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((batch, n, 32)), axis=2)[..., :per_token].astype(np.int32)


def label_intervals(n: int, radius: int, per_token: int = 3, seed: int = 0, batch: int = 1) -> Intervals:
    """Causal window + random label bitmasks (32 labels, `per_token` each)."""
    choice = random_labels(n, per_token, seed, batch)
    bits = np.zeros((batch, n), np.uint32)
    for c in range(per_token):
        bits |= np.left_shift(np.uint32(1), choice[..., c].astype(np.uint32))
    win = baselines.sliding_window(n, radius, causal=True)
    return dataclasses.replace(win, label_bits=jnp.asarray(bits).reshape(batch, 1, n, 1))


def label_pattern(n: int, radius: int):
    """`label_intervals`' labels as a `LabelPattern` (what "bucketed_pallas" runs in bucket-entry space)."""
    from sparse_attn.patterns.labels.base_graph import BaseGraph
    from sparse_attn.patterns.labels.pattern import LabelPattern

    labels = jnp.asarray(random_labels(n))[:, None]
    return LabelPattern.from_labels(labels, 32, base=BaseGraph(radius=radius, landmark_every=0, causal=True))


def kernel_pattern(p: Plan, n: int, name: str):
    make = {
        "dense": lambda: baselines.dense(n),
        "window256": lambda: baselines.sliding_window(n, p.window, causal=True),
        "labels": lambda: label_intervals(n, p.label_radius),
        "labels_bucketed": lambda: label_pattern(n, p.label_radius),
        "abca256": lambda: abca_intervals(n, p.interval),
        "causal": lambda: baselines.causal(n),
    }
    return make[name]()


def count_pairs(pattern, n: int, chunk: int = 512) -> int:
    """Allowed (query, key) pairs of sequence 0, head 0, in row chunks (O(chunk * n) memory)."""
    chunk = min(chunk, n)
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)

    @jax.jit
    def count(pat):
        def one(start):
            q_pos = (start + jnp.arange(chunk, dtype=jnp.int32)).reshape(1, 1, 1, chunk)
            return jnp.sum(pat.allowed(q_pos, k_pos)[:1, :1, 0], dtype=jnp.int32)

        return jnp.sum(jax.lax.map(one, jnp.arange(0, n, chunk, dtype=jnp.int32)))

    return int(count(pattern))


# -- timed methods: name -> Method ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Method:
    """fn(q, k, v, *extra) -> out or (out, pairs scalar); grads of fwd+bwd w.r.t. q, k, v (+ extra[0] if
    `grad_extra`)."""

    fn: object
    extra: tuple = ()
    pairs: int | None = None  # None: the fn returns them
    grad_extra: bool = False


def kernel_method(p: Plan, pattern, d: int, pairs: int) -> Method:
    scale = d**-0.5
    return Method(lambda q, k, v: pallas_attention(q, k, v, pattern, scale, config=p.config)[0], (), pairs)


def bucketed_kernel_method(p: Plan, pattern, d: int, pairs: int, tile: int | None = None) -> Method:
    """The label pattern through the kernels in bucket-entry space (metadata built inside the timed call); `tile`:
    square tiles instead of the defaults (the entry-space band is short: docs/labels.md, "bucketed_pallas")."""
    from sparse_attn.attention import attention

    config = p.config if tile is None else dataclasses.replace(
        p.config or kernels.KernelConfig(), block_sizes=kernels.BlockSizes(block_q=tile, block_k=tile))  # fmt: skip
    return Method(lambda q, k, v: attention(q, k, v, pattern, implementation="bucketed_pallas", config=config),
                  (), pairs)  # fmt: skip


def cudnn_method(p: Plan, causal: bool, pairs: int) -> Method:
    impl = None if p.interpret else "cudnn"  # the dry run has no cuDNN: XLA stands in (rows go to a tmp dir)
    return Method(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl),
                  (), pairs)  # fmt: skip


def abca_method(p: Plan, n: int, d: int, impl: str | None, pairs: int) -> Method:
    """`abca_core` with zones and projections as arguments (as in a model: nothing for XLA to constant-fold)."""
    from sparse_attn.modules.abca import AnchorProjections, abca_core
    from sparse_attn.patterns import abca as abca_lib

    zones = abca_lib.compute_zones(abca_lib.fixed_interval_anchors(1, n, p.interval))
    w = jax.random.normal(jax.random.key(1), (3, p.heads, d, d), jnp.float32) / math.sqrt(d)
    proj = AnchorProjections(*(x.astype(jnp.bfloat16) for x in w))

    def fn(q, k, v, zones, proj):
        return abca_core(q, k, v, zones, proj, max_zone=p.interval, causal=True, implementation=impl)[0]

    return Method(fn, (zones, proj), pairs)


def labels_method(p: Plan, n: int, d: int, impl: str | None) -> Method:
    """The label module's router and hard-phase `label_core` (window `label_radius`, 3 of 32 labels)."""
    from flax import nnx

    from sparse_attn.modules.labels import INFERENCE_STEP, label_core
    from sparse_attn.patterns.labels.base_graph import BaseGraph

    cfg = attention_config("labels", Context(seq_len=n, window=p.label_radius), num_labels=32, top_k=3,
                           landmark_every=0, phase="hard", implementation=impl, rope_base=None)  # block 128, soft 64
    module = cfg.make(p.heads * d, p.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module.router, nnx.Param)
    base = BaseGraph(radius=p.label_radius, landmark_every=0, causal=True)
    x = jax.random.normal(jax.random.key(2), (1, n, p.heads * d), jnp.float32).astype(jnp.bfloat16)

    def fn(q, k, v, x, params):
        r = nnx.merge(graphdef, params)(x)
        valid = jnp.full((q.shape[0],), n, jnp.int32)
        o, aux = label_core(q, k, v, r, cfg, base, step=jnp.int32(INFERENCE_STEP), valid_len=valid)
        return o, jnp.sum(aux["hard_keys"][0, 0])

    return Method(fn, (x, params))


def routing_method(p: Plan, n: int, d: int, impl: str | None) -> Method:
    """The non-crossing module's `core` (defect-pair router, T = 10, key rows [self, top, bottom])."""
    from flax import nnx

    cfg = attention_config("noncrossing_defect", Context(seq_len=n, window=n), implementation=impl,
                           rope_base=None)
    module = cfg.make(p.heads * d, p.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    x = jax.random.normal(jax.random.key(3), (1, n, p.heads * d), jnp.float32).astype(jnp.bfloat16)

    def fn(q, k, v, x, params):
        o, stats = nnx.merge(graphdef, params).core(x, q, k, v, jnp.full((q.shape[0],), n, jnp.int32))
        return o, stats["keys_per_query"] * n

    return Method(fn, (x, params), grad_extra=True)


def moba_method(n: int) -> Method:
    """MoBA's gate and attention over its selection (`studies.bench.moba_config`: blocks of n / 128, top-4)."""
    from sparse_attn.modules.moba import moba_core, moba_selection, moba_stats
    from sparse_attn.studies.bench import moba_config

    cfg = moba_config(n)

    def fn(q, k, v):
        vl = jnp.full((q.shape[0],), n, jnp.int32)
        sel = moba_selection(q, k, cfg, causal=True, valid_len=vl)
        o = moba_core(q, k, v, sel, cfg, causal=True, valid_len=vl)
        return o, moba_stats(sel, n, cfg, causal=True, valid_len=vl)["keys_per_query"] * n

    return Method(fn)


def nsa_method(p: Plan, n: int, d: int) -> Method:
    """NSA's three branches and gates (`NsaAttention.core`, `studies.bench.nsa_config`), every branch fed q's k, v."""
    from flax import nnx

    from sparse_attn.studies.bench import nsa_config

    module = nsa_config(n).make(p.heads * d, p.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    gates = jax.nn.sigmoid(jax.random.normal(jax.random.key(4), (1, n, 3, p.heads, 1), jnp.float32))

    def fn(q, k, v, gates, params):
        vl = jnp.full((q.shape[0],), n, jnp.int32)
        o, stats = nnx.merge(graphdef, params).core(q, (k, v), (k, v), (k, v), gates, vl, causal=True)
        return o, stats["keys_per_query"] * n

    return Method(fn, (gates, params))


def core_impls(mech: str) -> tuple[str | None, list[str]]:
    """(what None resolves to on this platform, the explicit implementations to time besides None)."""
    from sparse_attn.patterns.abca import ZonePattern
    from sparse_attn.patterns.labels.pattern import LabelPattern
    from sparse_attn.patterns.neighbours import NeighbourList

    kind = {"abca": ZonePattern, "labels": LabelPattern, "routing": NeighbourList}[mech]
    default = default_implementation(None, kind)
    # (the label hard phase's "xla"/"pallas" need a pattern without landmarks: the timed one has none)
    others = [i for i in available_implementations(kind) if i not in ("reference", default)]
    # "xla" last: its ABCA backward compiled 55-94 s
    order = {"pallas": 0, "bucketed_pallas": 0, "bucketed": 1, "packed": 2, "xla": 3}
    return default, sorted(others, key=lambda i: order.get(i, 9))


def method_list(p: Plan, n: int, d: int, part: str) -> list[tuple[str, object]]:
    """[(name, builder () -> Method)] of one pass in priority order; builders run only when the row's turn comes.
    part: "main" (kernels on patterns, cuDNN, cores with implementation=None), "impls" (the cores' other explicit
    implementations) or "scaling" (cuDNN dense, the window/ABCA/label kernels, the cores with None)."""
    pats = {}

    def pattern(name):
        if name not in pats:
            pats[name] = kernel_pattern(p, n, name)
        return pats[name]

    analytic = {"dense": n * n, "causal": n * (n + 1) // 2,
                "window256": sum(min(i, p.window) + 1 for i in range(n))}  # fmt: skip
    pairs_cache = {}

    def pairs(name):
        if name not in pairs_cache:
            pairs_cache[name] = analytic.get(name) or count_pairs(pattern(name), n)
        return pairs_cache[name]

    def ours(name):
        if name.startswith("labels_bucketed"):  # the same labels, so the same pairs as "labels"
            tile = 64 if name.endswith("64") else None
            return lambda: bucketed_kernel_method(p, pattern("labels_bucketed"), d, pairs("labels"), tile)
        return lambda: kernel_method(p, pattern(name), d, pairs(name))

    build = {
        "abca": lambda impl: abca_method(p, n, d, impl, pairs("abca256")),
        "labels": lambda impl: labels_method(p, n, d, impl),
        "routing": lambda impl: routing_method(p, n, d, impl),
    }
    if part == "impls":
        return [(f"{mech}_core_{impl}", lambda mech=mech, impl=impl: build[mech](impl))
                for mech in CORES for impl in core_impls(mech)[1]]  # fmt: skip
    out = [("cudnn_dense", lambda: cudnn_method(p, False, pairs("dense")))]
    kinds = ("window256", "abca256", "labels", "labels_bucketed") if part == "scaling" else (
        "dense", "window256", "labels", "abca256", "causal", "labels_bucketed", "labels_bucketed64")  # fmt: skip
    out += [(f"ours_{k}", ours(k)) for k in kinds]
    if part == "main":
        out.append(("cudnn_causal", lambda: cudnn_method(p, True, pairs("causal"))))
        out += [("moba_core", lambda: moba_method(n)), ("nsa_core", lambda: nsa_method(p, n, d))]
    return out + [(f"{mech}_core_default", lambda mech=mech: build[mech](None)) for mech in CORES]


# -- running one row --------------------------------------------------------------------------------------------


