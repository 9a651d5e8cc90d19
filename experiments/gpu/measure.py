"""One measured row of the GPU check: compile under a time limit (an abandoned compile is recorded as an error),
time a method's fwd or fwd+bwd, or check our kernels against a float64 numpy oracle on the host."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.executors.pallas import pallas_attention
from experiments.gpu.methods import (
    TOL,
    Method,
    Plan,
    abca_intervals,
    label_intervals,
)
from sparse_attn.patterns import baselines
from sparse_attn.studies import bench as benchlib


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
    return jax.jit(m.fn)


def _fwd_bwd(m: Method):
    def loss(*args):
        return jnp.sum(m.fn(*args)[0].astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=m.grad_argnums))


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
    """float64 numpy oracle: (out, dq, dk, dv) of softmax attention under `mask` [B|1, H|1, Nq, Nk] with GQA; rows
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
    group = lambda x: x.reshape(b, k.shape[1], h // r, r, d).sum(axis=3)  # noqa: E731
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
        fn = lambda q, k, v: pallas_attention(q, k, v, pattern, scale, config=p.config)[0]  # noqa: E731
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
           zip(("out", "dq", "dk", "dv"), got, want, strict=True)}  # fmt: skip
    tol = TOL[jnp.dtype(dtype).name]
    finite = all(bool(np.isfinite(np.asarray(g, np.float64)).all()) for g in got)
    return dict(first_call_s=round(first, 2), max_abs_err=err, tol=tol, ok=finite and max(err.values()) <= tol)


# -- the run ----------------------------------------------------------------------------------------------------


def add_run_args(ap, *, out: str | None, budget_s: float | None = None, compile_limit_s: float | None = None) -> None:
    """The flags the check and the tile sweep share (None: the plan's default; `out=None`: --out is required)."""
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpret mode, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=budget_s,
                    help=f"no row starts after this many seconds (default {budget_s or 'the plan: 300'})")
    ap.add_argument("--compile-limit-s", type=float, default=compile_limit_s,
                    help=f"abandon a compile after this long (default {compile_limit_s or 'the plan: 30'})")
    ap.add_argument("--out", default=out, required=out is None, help="directory of the .jsonl rows and .md table")


def require_gpu(dry_run: bool) -> None:
    if not dry_run and jax.default_backend() != "gpu":
        raise SystemExit("no GPU: run with --dry-run (CPU, interpret mode) instead")
