"""One short GPU run (docs/kernels.md): bf16 timings in priority order, then fp32/bf16 correctness, every row
appended to a JSON-lines file the moment it is measured.

Command (one H200, nothing installed: Python 3.12, jax 0.11.2, flax, optax, orbax, chex; about 5 minutes):
    SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 420 python3 -m experiments.gpu.check [--out DIR]
        -> appends to DIR/gpu_check.jsonl (default experiments/results/), rewrites DIR/gpu_check.md
    (on a lent machine: --out $OUT, then append $OUT/gpu_check.jsonl to experiments/results/gpu_check.jsonl and
    copy the .md; the commit is passed in because the copy there may have no git)
    python -m experiments.gpu.check --dry-run --out /tmp/x   # CPU, interpret mode, tiny sizes: every code path

Order (whatever does not fit the budget is recorded as a `skipped` row, never silently dropped):
  1. n = 16384, d = 64, then d = 128; B = 1, H = 16 (no GQA), bf16, fwd then fwd+bwd per method:
     cudnn_dense, ours_dense, ours_window256, ours_labels, ours_abca256, ours_causal, ours_labels_bucketed(64),
     cudnn_causal (the kernels on a pattern: `pallas_attention`; `ours_labels_bucketed`: the same labels as a
     `LabelPattern` through "bucketed_pallas", the kernels in bucket-entry space; `..._bucketed64` with 64x64
     tiles), then the whole mechanism cores as a user calls them with
     `implementation=None` (`<mech>_core_default`; the table names what None resolved to): `abca_core_*`
     (`abca_core`, anchors every 256), `labels_core_*` (the label module's router + hard-phase `label_core`:
     window 1024, 3 of 32 labels), `routing_core_*` (the non-crossing module's `core`: router, diagrams, key rows,
     attention; the issue's name "routing" for the mechanism the code calls "noncrossing").
  2. The cores' other explicit implementations at d = 64 (`abca_core_pallas`, ..., "xla" last).
  3. Scaling, d = 64, n = 65536 and 131072: cudnn_dense, the window/ABCA/label kernels and the three cores (None).
  4. The cores' other implementations at d = 128.
  5. Correctness (a reserved slice of the budget): our kernels fwd+bwd at n = 512 (B=2, H=4, G=2, D=64; one
     fp32 D=128 case) on seven pattern kinds, fp32 and bf16, against a float64 numpy oracle on the host (one
     device compile per case). fp32 must be within 2e-4, bf16 within 3e-2 (absolute, out/dq/dk/dv).

Row (one JSON object per line): method, n, d, mode ("fwd" | "fwd+bwd"), ms, tflops, pairs, first_call_s, dtype,
commit, device, jax, date (the run's start, shared by its rows); `skipped` (why) or `error` instead of ms where
that happened; correctness rows are method "check_<pattern>" with max_abs_err, tol, ok. `pairs`: allowed
(query, key) pairs per (sequence, head) (ABCA core: its stage 1+3 pattern; labels core: the router's hard keys;
routing core: valid key-row slots). TFLOP/s: 4·d flops per pair and head forward, 3.5x that for fwd+bwd.
`first_call_s`: compile (capped by --compile-limit-s; a compile still running then is abandoned and recorded as
an error) + the first call.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import sparse_attn.kernels as kernels
from sparse_attn.attention import available_implementations, default_implementation
from sparse_attn.patterns import baselines
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies.runs import git_commit

RESULTS = os.path.join(os.path.dirname(__file__), "results")
TOL = {"float32": 2e-4, "bfloat16": 3e-2}
# The issue's targets (speed-up vs cuDNN dense at 16k); cores are judged by their best implementation.
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
    return Method(lambda q, k, v: kernels.pallas_attention(q, k, v, pattern, scale, config=p.config)[0], (), pairs)


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

    from sparse_attn.modules.labels import INFERENCE_STEP, LabelAttentionConfig, label_core
    from sparse_attn.patterns.labels.base_graph import BaseGraph

    cfg = LabelAttentionConfig(num_labels=32, top_k=3, radius=p.label_radius, landmark_every=0, phase="hard",
                               implementation=impl, rope_base=None)  # fmt: skip
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

    from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig

    cfg = NoncrossingAttentionConfig(implementation=impl, rope_base=None)
    module = cfg.make(p.heads * d, p.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    x = jax.random.normal(jax.random.key(3), (1, n, p.heads * d), jnp.float32).astype(jnp.bfloat16)

    def fn(q, k, v, x, params):
        o, stats = nnx.merge(graphdef, params).core(x, q, k, v, jnp.full((q.shape[0],), n, jnp.int32))
        return o, stats["keys_per_query"] * n

    return Method(fn, (x, params), grad_extra=True)


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
    return out + [(f"{mech}_core_default", lambda mech=mech: build[mech](None)) for mech in CORES]


# -- running one row --------------------------------------------------------------------------------------------


class CompileTimeout(Exception):
    pass


_ABANDONED: list[threading.Thread] = []


def compile_within(jitted, args, limit_s: float):
    """AOT-compile in a daemon thread; past `limit_s` the compile is abandoned (it finishes unseen in the
    background, where XLA's autotuning may still use the device briefly) and CompileTimeout raised."""
    box = {}

    def work():
        try:
            box["exe"] = jitted.lower(*args).compile()
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
            box["err"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(max(limit_s, 0.0))
    if t.is_alive():
        _ABANDONED.append(t)
        raise CompileTimeout(f"compile exceeded {limit_s:.0f} s (abandoned)")
    if "err" in box:
        raise box["err"]
    return box["exe"]


def _fwd(m: Method):
    return jax.jit(lambda q, k, v, *extra: m.fn(q, k, v, *extra))


def _fwd_bwd(m: Method):
    def loss(q, k, v, *extra):
        out = m.fn(q, k, v, *extra)
        out = out[0] if m.pairs is None else out
        return jnp.sum(out.astype(jnp.float32))

    argnums = (0, 1, 2, 3) if m.grad_extra else (0, 1, 2)
    return jax.jit(jax.grad(loss, argnums=argnums))


def time_row(m: Method, mode: str, qkv, p: Plan, limit_s: float) -> dict:
    """{ms, first_call_s[, pairs]}: compile within the limit, a first call, one more call to size the repeats,
    then up to `reps` timed calls (median; fewer when a call is slow: about 3 s of repeats at most)."""
    args = tuple(qkv) + tuple(m.extra)
    t0 = time.perf_counter()
    exe = compile_within(_fwd(m) if mode == "fwd" else _fwd_bwd(m), args, limit_s)
    out = jax.block_until_ready(exe(*args))
    res = {"first_call_s": round(time.perf_counter() - t0, 2)}
    if mode == "fwd" and m.pairs is None:
        res["pairs"] = float(out[1])
    t1 = time.perf_counter()
    jax.block_until_ready(exe(*args))
    reps = max(1, min(p.reps, int(3.0 / max(time.perf_counter() - t1, 1e-4))))
    res["ms"] = benchlib.time_fn(exe, *args, repeats=reps, warmup=0) * 1e3
    return res


# -- correctness ------------------------------------------------------------------------------------------------


CHECKS = ("causal", "labels", "abca", "bigbird", "longformer", "window", "dense")


def check_pattern(p: Plan, n: int, name: str):
    """The correctness patterns (batch 2 where they can differ per sequence: padding, labels, random blocks)."""
    block = 32 if p.interpret else 64
    valid = jnp.array([n, n - 37])
    make = {
        "causal": lambda: baselines.causal(n, valid_len=valid),
        "labels": lambda: label_intervals(n, 4 * p.check_window, per_token=2, batch=2),
        "abca": lambda: abca_intervals(n, p.check_window),
        "bigbird": lambda: baselines.bigbird(n, p.check_window, 2, 2, block, jax.random.key(0), batch=2),
        "longformer": lambda: baselines.longformer(n, p.check_window, 4, valid_len=valid),
        "window": lambda: baselines.sliding_window(n, p.check_window, causal=True),
        "dense": lambda: baselines.dense(n),
    }
    return make[name]()


def check_cases(p: Plan) -> list[tuple[str, int, object]]:
    """(pattern, d, dtype) in priority order: fp32 (the new defaults) beside bf16 on each kind, one fp32 D=128."""
    d = 32 if p.interpret else 64
    cases = [(name, d, dt) for name in CHECKS for dt in (jnp.float32, jnp.bfloat16)]
    cases.insert(2, ("causal", 2 * d, jnp.float32))
    return cases


def reference64(q, k, v, do, mask, scale):
    """float64 numpy oracle: (out, dq, dk, dv) of softmax attention under `mask` [B|1, H|1, N, N] with GQA; rows
    with no allowed key output 0 and pass no gradient."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, n, h, d = q.shape
    r = h // k.shape[2]
    kh, vh = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)  # [B, N, H, D]
    s = np.einsum("bqhd,bkhd->bhqk", q, kh) * scale
    m = np.broadcast_to(np.asarray(mask, bool), s.shape)
    s = np.where(m, s, -np.inf)
    smax = np.max(s, axis=-1, keepdims=True)
    e = np.where(m, np.exp(s - np.where(np.isfinite(smax), smax, 0.0)), 0.0)
    z = np.sum(e, axis=-1, keepdims=True)
    pr = e / np.where(z > 0, z, 1.0)
    out = np.einsum("bhqk,bkhd->bqhd", pr, vh)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vh)
    ds = pr * (dp - np.sum(pr * dp, axis=-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kh) * scale
    dkh = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dvh = np.einsum("bhqk,bqhd->bkhd", pr, do)
    group = lambda x: x.reshape(b, n, h // r, r, d).sum(axis=3)  # noqa: E731
    return out, dq, group(dkh), group(dvh)


def check_row(p: Plan, name: str, d: int, dtype, limit_s: float) -> dict:
    n = p.check_n
    pattern = check_pattern(p, n, name)
    ks = jax.random.split(jax.random.key(n + d), 4)
    q = jax.random.normal(ks[0], (2, n, 4, d), jnp.float32).astype(dtype)
    k, v = (jax.random.normal(x, (2, n, 2, d), jnp.float32).astype(dtype) for x in ks[1:3])
    do = jax.random.normal(ks[3], q.shape, jnp.float32).astype(dtype)
    scale = d**-0.5

    def grads(q, k, v, do, pattern):
        fn = lambda q, k, v: kernels.pallas_attention(q, k, v, pattern, scale, config=p.config)[0]  # noqa: E731
        out, vjp = jax.vjp(fn, q, k, v)
        return (out,) + vjp(do)

    t0 = time.perf_counter()
    exe = compile_within(jax.jit(grads), (q, k, v, do, pattern), limit_s)
    got = jax.device_get(exe(q, k, v, do, pattern))
    first = time.perf_counter() - t0
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        mask = jax.device_get(jax.jit(lambda pat: pat.to_dense())(jax.device_put(pattern, cpu)))
    want = reference64(*jax.device_get((q, k, v, do)), mask, scale)
    err = {key: float(np.max(np.abs(np.asarray(g, np.float64) - w))) for key, g, w in
           zip(("out", "dq", "dk", "dv"), got, want)}  # fmt: skip
    tol = TOL[jnp.dtype(dtype).name]
    finite = all(bool(np.isfinite(np.asarray(g, np.float64)).all()) for g in got)
    return dict(first_call_s=round(first, 2), max_abs_err=err, tol=tol, ok=finite and max(err.values()) <= tol)


# -- the run ----------------------------------------------------------------------------------------------------


class Recorder:
    """Appends each row to the JSONL (flushed and fsynced: a killed run keeps what it had) and rewrites the
    markdown table from this run's rows."""

    def __init__(self, out_dir: str, common: dict, p: Plan, name: str = "gpu_check", render=None):
        """`render(rows, common, plan) -> markdown` (default: this module's table) writes `<name>.md`."""
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = os.path.join(out_dir, f"{name}.jsonl")
        self.md = os.path.join(out_dir, f"{name}.md")
        self.common, self.plan, self.rows, self.render = common, p, [], render or markdown

    def emit(self, row: dict, log) -> dict:
        row = dict(row, **self.common)
        self.rows.append(row)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with open(self.md, "w") as f:
            f.write(self.render(self.rows, self.common, self.plan))
        log(_describe(row))
        return row


def _describe(r: dict) -> str:
    head = f"{r['method']:24s} n={r['n']:6d} d={r['d']:3d} {r['mode']:7s} {r.get('dtype', ''):8s}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} ERROR {r['error'][:160]}"
    if "ok" in r:
        return f"{head} {'ok' if r['ok'] else 'FAIL'} {r['max_abs_err']}"
    return f"{head} {r['ms']:9.3f} ms {r['tflops'] or 0:7.1f} TF/s first {r['first_call_s']} s"


def passes(p: Plan) -> list[tuple[int, int, str]]:
    """(n, d, part) in priority order: the table's rows at d = 64 then 128, the cores' other implementations at
    d = 64, scaling at d = 64, the other implementations at d = 128."""
    d0, rest = p.head_dims[0], p.head_dims[1:]
    out = [(p.n, d, "main") for d in p.head_dims] + [(p.n, d0, "impls")]
    return out + [(n, d0, "scaling") for n in p.scale_lengths] + [(p.n, d, "impls") for d in rest]


def timings(p: Plan, rec: Recorder, t_start: float, log, only) -> None:
    stop = p.budget_s - p.check_reserve_s
    for n, d, part in passes(p):
        ks = jax.random.split(jax.random.key(d), 3)
        qkv = None
        for name, build in method_list(p, n, d, part):
            if only and not any(name.startswith(o) for o in only):
                continue
            method = None
            for mode in ("fwd", "fwd+bwd"):
                row = dict(method=name, n=n, d=d, mode=mode, dtype="bfloat16")
                left = stop - (time.perf_counter() - t_start)
                if left <= 0:
                    rec.emit(dict(row, skipped="time budget"), log)
                    continue
                try:
                    if qkv is None:
                        qkv = [jax.random.normal(x, (1, n, p.heads, d), jnp.float32).astype(jnp.bfloat16) for x in ks]
                    method = method or build()
                    res = time_row(method, mode, qkv, p, min(p.compile_limit_s, left))
                    pairs = method.pairs if method.pairs is not None else res.pop("pairs", None)
                    if pairs is None:  # fwd+bwd of a core whose fwd row did not run: its pairs are unknown
                        pairs = next((r["pairs"] for r in reversed(rec.rows) if r["method"] == name and
                                      r["n"] == n and r["d"] == d and r.get("pairs") is not None), None)  # fmt: skip
                    flops = 4.0 * d * pairs * p.heads * (1.0 if mode == "fwd" else 3.5) if pairs else None
                    tflops = flops / (res["ms"] * 1e-3) / 1e12 if flops else None
                    rec.emit(dict(row, ms=res["ms"], tflops=tflops, pairs=pairs, first_call_s=res["first_call_s"]),
                             log)  # fmt: skip
                except Exception as e:  # noqa: BLE001  (a failure is a result)
                    rec.emit(dict(row, error=f"{type(e).__name__}: {str(e)[:400]}"), log)


def correctness(p: Plan, rec: Recorder, t_start: float, log, only) -> None:
    for name, d, dtype in check_cases(p):
        if only and not any(f"check_{name}".startswith(o) for o in only):
            continue
        row = dict(method=f"check_{name}", n=p.check_n, d=d, mode="fwd+bwd", dtype=jnp.dtype(dtype).name)
        left = p.budget_s - (time.perf_counter() - t_start)
        if left <= 0:
            rec.emit(dict(row, skipped="time budget"), log)
            continue
        try:
            rec.emit(dict(row, **check_row(p, name, d, dtype, min(p.compile_limit_s, left))), log)
        except Exception as e:  # noqa: BLE001
            rec.emit(dict(row, ok=False, error=f"{type(e).__name__}: {str(e)[:400]}"), log)


# -- markdown ---------------------------------------------------------------------------------------------------


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict], common: dict, p: Plan) -> str:
    lines = [f"# GPU check: {common['device']}, jax {common['jax']}, commit {common['commit']}, {common['date']}", "",
             "Command: `SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 420 python3 -m experiments.gpu.check` "
             f"(B=1, H={p.heads}, bf16; rows also in gpu_check.jsonl). Speed-up: cuDNN dense ms / ms at the same "
             "n, d, mode; pair ratio: cuDNN dense pairs / pairs; rate: TFLOP/s / cuDNN dense TFLOP/s.", ""]  # fmt: skip
    timed = [r for r in rows if not r["method"].startswith("check_")]
    base = {(r["n"], r["d"], r["mode"]): r for r in timed if r["method"] == "cudnn_dense" and "ms" in r}
    defaults = {m: core_impls(m)[0] for m in CORES}
    for n, d, mode in dict.fromkeys((r["n"], r["d"], r["mode"]) for r in timed):
        b = base.get((n, d, mode))
        lines += [f"## n = {n}, d = {d}, {mode}", "",
                  "| method | ms | TFLOP/s | rate / cuDNN | speed-up vs cuDNN dense | target | pair ratio | "
                  "first call s |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in (r for r in timed if (r["n"], r["d"], r["mode"]) == (n, d, mode)):
            name = r["method"]
            mech = name.split("_core_")[0] if "_core_" in name else None
            label = f"{name} (= {defaults[mech]})" if mech and name.endswith("_default") else name
            if "ms" not in r:
                lines.append(f"| {label} | {r.get('skipped') or r.get('error', '')[:80]} | | | | | | |")
                continue
            speed = b["ms"] / r["ms"] if b else None
            rate = r["tflops"] / b["tflops"] if b and r["tflops"] and b["tflops"] else None
            ratio = b["pairs"] / r["pairs"] if b and r.get("pairs") else None
            target = TARGETS.get(f"{mech}_core" if mech else name)
            lines.append(f"| {label} | {r['ms']:.3f} | {_fmt(r['tflops'], '.1f')} | {_fmt(rate, '.2f')} | "
                         f"{_fmt(speed, '.2f')}x | {'' if target is None else f'>= {target}x'} | "
                         f"{_fmt(ratio, '.1f')} | {r['first_call_s']} |")  # fmt: skip
        lines.append("")
    scale = [r for r in timed if "ms" in r and r["n"] != p.n and r["d"] == p.head_dims[0]]
    if scale:
        lines += [f"## Scaling: time(n) / time({p.n}), d = {p.head_dims[0]}", "", "| method | mode | n | ratio |",
                  "|---|---|---|---|"]  # fmt: skip
        ref = {(r["method"], r["mode"]): r["ms"] for r in timed if "ms" in r and r["n"] == p.n}
        for r in scale:
            base_ms = ref.get((r["method"], r["mode"]))
            lines.append(f"| {r['method']} | {r['mode']} | {r['n']} | "
                         f"{_fmt(r['ms'] / base_ms if base_ms else None, '.2f')} |")  # fmt: skip
        lines.append("")
    checks = [r for r in rows if r["method"].startswith("check_")]
    if checks:
        lines += [f"## Correctness: our kernels fwd+bwd vs a float64 oracle (n = {p.check_n}, B=2, H=4, G=2)", "",
                  "| pattern | d | dtype | ok | max abs err (out, dq, dk, dv) | tol | first call s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in checks:
            why = r.get("skipped") or r.get("error", "")[:80]
            errs = ", ".join(f"{e:.1e}" for e in r["max_abs_err"].values()) if "max_abs_err" in r else why
            lines.append(f"| {r['method'][6:]} | {r['d']} | {r['dtype']} | {r.get('ok', '-')} | {errs} | "
                         f"{r.get('tol', '-')} | {r.get('first_call_s', '-')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpret mode, tiny sizes")
    ap.add_argument("--budget-s", type=float, help="no row starts after this many seconds (default 300)")
    ap.add_argument("--check-reserve-s", type=float, help="seconds of the budget kept for correctness (default 70)")
    ap.add_argument("--compile-limit-s", type=float, help="abandon a compile after this long (default 30)")
    ap.add_argument("--only", nargs="+", help="run only rows whose method starts with one of these")
    ap.add_argument("--skip-checks", action="store_true", help="timings only")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    p = plan(args.dry_run, args.budget_s)
    if args.check_reserve_s is not None:
        p = dataclasses.replace(p, check_reserve_s=args.check_reserve_s)
    if args.compile_limit_s is not None:
        p = dataclasses.replace(p, compile_limit_s=args.compile_limit_s)
    log = lambda s: print(f"[{time.perf_counter() - t_start:6.1f}s] {s}", flush=True)  # noqa: E731
    if not args.dry_run and jax.default_backend() != "gpu":
        raise SystemExit("no GPU: run with --dry-run (CPU, interpret mode) instead")
    if args.dry_run and os.path.abspath(args.out) == os.path.abspath(RESULTS):
        raise SystemExit("--dry-run rows are not results: pass --out to a scratch directory")
    dev = jax.devices()[0]
    common = dict(commit=git_commit(), device=dev.device_kind, jax=jax.__version__,
                  date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))  # fmt: skip
    rec = Recorder(args.out, common, p)
    log(f"device {dev.device_kind} ({jax.default_backend()}), commit {common['commit']}, budget {p.budget_s:.0f} s")
    try:
        timings(p, rec, t_start, log, args.only)
        if not args.skip_checks:
            correctness(p, rec, t_start, log, args.only)
    except Exception:  # noqa: BLE001  (rows so far are on disk; say what broke)
        log(traceback.format_exc()[-2000:])
    log(f"{len(rec.rows)} rows -> {rec.jsonl}, {rec.md}")
    return rec.rows


if __name__ == "__main__":
    main()
    if any(t.is_alive() for t in _ABANDONED):  # rows are on disk: don't wait for an abandoned compile
        os._exit(0)
