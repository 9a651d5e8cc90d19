"""What the GPU check times: the plan (sizes, budget), the patterns, and each method as a jitted fwd and fwd+bwd
(our kernels, cuDNN, and the registered mechanisms' benchmark cores); `method_list` gives them in the check's priority
order (experiments/gpu/check.py)."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

import sparse_attn.kernels as kernels
from sparse_attn import registry
from sparse_attn.attention import available_implementations, default_implementation
from sparse_attn.executors.pallas import pallas_attention
from sparse_attn.patterns import baselines
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.labels.pattern import LabelPattern
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.studies.bench import BenchSpec

RESULTS = os.path.join(os.path.dirname(__file__), "results")
TOL = {"float32": 2e-4, "bfloat16": 3e-2}
# Targets (speed-up vs cuDNN dense at 16k); cores are judged by their best implementation.
TARGETS = {"ours_dense": 0.8, "ours_window256": 30, "ours_labels": 20, "ours_labels_bucketed": 20,
           "ours_labels_bucketed64": 20, "ours_abca256": 40, "abca_core": 25, "labels_core": 12,
           "noncrossing_core": 20}  # fmt: skip
# The registered benchmark cores the check times (`sparse_attn.registry.Mechanism.bench`), and those whose other
# explicit implementations it times too, by the pattern type whose executor `implementation` picks.
CORES = ("abca", "labels", "noncrossing", "moba", "nsa")
SWEPT = {"abca": ZonePattern, "labels": LabelPattern, "noncrossing": NeighbourList}


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
    """fn(q, k, v, *extra) -> (out, pairs or None); fwd+bwd differentiates the args at `grad_argnums`. `pairs`:
    allowed pairs per (sequence, head) when known ahead (None: the fn returns them)."""

    fn: object
    extra: tuple = ()
    pairs: float | None = None
    grad_argnums: tuple[int, ...] = (0, 1, 2)


def kernel_method(p: Plan, pattern, d: int, pairs: int) -> Method:
    scale = d**-0.5
    return Method(lambda q, k, v: (pallas_attention(q, k, v, pattern, scale, config=p.config)[0], None), (), pairs)


def bucketed_kernel_method(p: Plan, pattern, d: int, pairs: int, tile: int | None = None) -> Method:
    """The label pattern through the kernels in bucket-entry space (metadata built inside the timed call); `tile`:
    square tiles instead of the defaults (the entry-space band is short: docs/labels.md, "bucketed_pallas")."""
    from sparse_attn.attention import attention

    config = p.config if tile is None else dataclasses.replace(
        p.config or kernels.KernelConfig(), block_sizes=kernels.BlockSizes(block_q=tile, block_k=tile))  # fmt: skip
    fn = lambda q, k, v: (attention(q, k, v, pattern, implementation="bucketed_pallas", config=config), None)  # noqa: E731
    return Method(fn, (), pairs)


def cudnn_method(p: Plan, causal: bool, pairs: int) -> Method:
    impl = None if p.interpret else "cudnn"  # the dry run has no cuDNN: XLA stands in (rows go to a tmp dir)
    return Method(lambda q, k, v: (jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl),
                                   None), (), pairs)  # fmt: skip


def _record(core: str) -> registry.Mechanism:
    return next(m for m in registry.mechanisms() if core in m.bench)


def core_method(p: Plan, core: str, n: int, d: int, impl: str | None) -> Method:
    """A registered mechanism's benchmark core (`sparse_attn.registry.BenchCore`) at B = 1, bf16, the window
    `label_radius`, causal where the mechanism runs causally; its pairs come from its pattern or its fn."""
    causal = any(preset.causal for preset in _record(core).presets.values())
    spec = BenchSpec(n=n, batch=1, heads=p.heads, head_dim=d, dtype="bfloat16", radius=p.label_radius, impl=impl,
                     key=jax.random.key(n + d), causal=causal)  # fmt: skip
    bench = registry.bench_cores()[core](spec)
    pairs = None if bench.pattern is None else count_pairs(bench.pattern, n)
    return Method(bench.fn, bench.args[3:], pairs, bench.grad_argnums)


def core_impls(core: str) -> tuple[str | None, list[str]]:
    """(what None resolves to on this platform, the explicit implementations to time besides None)."""
    kind = SWEPT[core]
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

    def core(name, impl):
        return lambda: core_method(p, name, n, d, impl)

    if part == "impls":
        return [(f"{name}_core_{impl}", core(name, impl)) for name in SWEPT for impl in core_impls(name)[1]]
    out = [("cudnn_dense", lambda: cudnn_method(p, False, pairs("dense")))]
    kinds = ("window256", "abca256", "labels", "labels_bucketed") if part == "scaling" else (
        "dense", "window256", "labels", "abca256", "causal", "labels_bucketed", "labels_bucketed64")  # fmt: skip
    out += [(f"ours_{k}", ours(k)) for k in kinds]
    if part == "main":
        out.append(("cudnn_causal", lambda: cudnn_method(p, True, pairs("causal"))))
    cores = CORES if part == "main" else SWEPT  # scaling: the swept cores
    return out + [(f"{name}_core_default", core(name, None)) for name in cores]


# -- running one row --------------------------------------------------------------------------------------------


