"""GPU check of the Pallas kernels (docs/kernels.md): correctness on the device, then bf16 timings against cuDNN.

Command (one H200, budgeted to finish in < 8 min; the budget skips, and records, whatever does not fit):
    .venv/bin/python -m experiments.gpu_check                 # writes experiments/results/gpu_check.{json,md}
    .venv/bin/python -m experiments.gpu_check --dry-run       # CPU, interpret mode, tiny sizes: checks the script

Timed, forward and forward+backward, B=1, H=16 heads (no GQA, so every method does the same work), n = 4k..32k,
d = 64 and 128: dense cuDNN (`jax.nn.dot_product_attention(implementation="cudnn")`, plain and causal), JAX's own
Pallas flash attention (`jax.experimental.pallas.ops.gpu.attention.mha`, plain and causal) and ours on dense,
causal, causal window (radius 256), ABCA (anchors every 256) and label (window 1024 + 3-of-32 label bitmasks)
patterns, and the whole causal ABCA core (gather, handshake, zones) through its "packed" and "pallas"
implementations. TFLOP/s counts useful work only: 4*D flops per allowed (query, key) pair forward, 2.5x that
backward (for the ABCA core: the stage 1+3 pairs of `abca256`; the handshake's few pairs are not counted).
Acceptance (docs/kernels.md): at 16k, ours reaches >= 0.5 of cuDNN dense's rate per computed pair.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import sparse_attn.kernels as kernels
from experiments import benchlib
from sparse_attn.executors.reference import reference_attention
from sparse_attn.executors.xla import xla_attention
from sparse_attn.patterns import baselines
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.neighbours import NeighbourList

RESULTS = os.path.join(os.path.dirname(__file__), "results")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    check_sizes: tuple[int, ...]
    lengths: tuple[int, ...]
    head_dims: tuple[int, ...]
    heads: int
    reps: int
    budget_s: float
    config: kernels.KernelConfig | None  # None: platform defaults
    interpret: bool


def plan(dry_run: bool, budget_s: float) -> Plan:
    if dry_run:
        cfg = kernels.KernelConfig(
            backend="triton", interpret=True, block_sizes=kernels.BlockSizes(block_q=64, block_k=64)
        )
        return Plan(check_sizes=(128,), lengths=(256,), head_dims=(32,), heads=2, reps=1, budget_s=budget_s,
                    config=cfg, interpret=True)  # fmt: skip
    return Plan(check_sizes=(512, 2048), lengths=(16384, 4096, 8192, 32768), head_dims=(64, 128), heads=16,
                reps=5, budget_s=budget_s, config=None, interpret=False)  # fmt: skip


# -- patterns ---------------------------------------------------------------------------------------------------


def abca(n: int, interval: int = 256) -> Intervals:
    """ABCA's stage 1+3 intervals (anchors every `interval`), from its builders when present."""
    try:
        from sparse_attn.patterns import abca as abca_lib

        zones = abca_lib.compute_zones(abca_lib.fixed_interval_anchors(1, n, interval))
        return abca_lib.layer_intervals(zones, causal=True, max_zone=interval)
    except (ImportError, AttributeError):  # builders not there: the same ranges by hand
        i = jnp.arange(n, dtype=jnp.int32)
        anchor = (i // interval) * interval
        lo = jnp.where(i == anchor, jnp.maximum(anchor - interval, 0), anchor)
        return Intervals(lo[None, None], i[None, None], causal=True, reach=(interval, 0))


def labels(n: int, radius: int = 1024, per_token: int = 3, seed: int = 0) -> Intervals:
    """Causal window + label bitmasks (W = 1 word: 32 labels, `per_token` each), built directly."""
    rng = np.random.default_rng(seed)
    choice = np.argsort(rng.random((n, 32)), axis=1)[:, :per_token]
    bits = np.zeros(n, np.uint32)
    for c in range(per_token):
        bits |= np.left_shift(np.uint32(1), choice[:, c].astype(np.uint32))
    win = baselines.sliding_window(n, radius, causal=True)
    return dataclasses.replace(win, label_bits=jnp.asarray(bits).reshape(1, 1, n, 1))


def abca_core(n: int, d: int, heads: int, implementation: str, interval: int = 256):
    """The whole causal ABCA core (gather, 1 chain handshake with its re-projections, zones) as (q, k, v) -> out."""
    from sparse_attn.modules.abca import AnchorProjections
    from sparse_attn.modules.abca import abca_core as core
    from sparse_attn.patterns import abca as abca_lib

    zones = abca_lib.compute_zones(abca_lib.fixed_interval_anchors(1, n, interval))
    eye = jnp.broadcast_to(jnp.eye(d, dtype=jnp.bfloat16), (heads, d, d))
    proj = AnchorProjections(eye, eye, eye)
    kw = {"max_zone": interval, "causal": True, "implementation": implementation}
    return lambda q, k, v: core(q, k, v, zones, proj, **kw)[0]


def patterns(n: int) -> dict[str, Intervals]:
    return {
        "dense": baselines.dense(n),
        "causal": baselines.causal(n),
        "window256": baselines.sliding_window(n, 256, causal=True),
        "abca256": abca(n),
        "labels": labels(n),
    }


def neighbours3(n: int) -> NeighbourList:
    """K = 3 rows (self and the two previous tokens): the non-crossing executors' shape, served by the XLA gather."""
    i = jnp.arange(n, dtype=jnp.int32)[:, None]
    idx = i - jnp.arange(3, dtype=jnp.int32)[None]
    return NeighbourList(jnp.maximum(idx, 0)[None, None], (idx >= 0)[None, None])


def count_pairs(pattern, n: int, chunk: int = 512) -> int:
    """Allowed (query, key) pairs of a head-shared pattern, in row chunks (O(chunk * n) memory)."""
    chunk = min(chunk, n)
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)

    @jax.jit
    def count(p):
        def one(start):
            q_pos = (start + jnp.arange(chunk, dtype=jnp.int32)).reshape(1, 1, 1, chunk)
            return jnp.sum(p.allowed(q_pos, k_pos)[:, :1, 0], dtype=jnp.int32)

        return jnp.sum(jax.lax.map(one, jnp.arange(0, n, chunk, dtype=jnp.int32)))

    return int(count(pattern))


# -- correctness ------------------------------------------------------------------------------------------------

TOL = {"float32": 2e-4, "bfloat16": 3e-2}  # on-device matmuls round more than the CPU tests' 5e-5


def correctness(p: Plan, log) -> list[dict]:
    rows = []
    for n in p.check_sizes:
        block = 64 if p.interpret else 128
        cases = dict(patterns(n), longformer=baselines.longformer(n, 64, 4, valid_len=jnp.array([n, n - 100])),
                     bigbird=baselines.bigbird(n, 64, 2, 2, block, jax.random.key(0), batch=2))  # fmt: skip
        for name, pat in cases.items():
            for dtype in (jnp.float32, jnp.bfloat16):
                ks = jax.random.split(jax.random.key(n), 4)
                q = jax.random.normal(ks[0], (2, n, 4, 64 if not p.interpret else 32), jnp.float32).astype(dtype)
                k, v = (jax.random.normal(x, q.shape[:2] + (2, q.shape[3]), jnp.float32).astype(dtype) for x in ks[1:3])
                ct = jax.random.normal(ks[3], q.shape, jnp.float32)
                try:
                    got = _grads(q, k, v, ct, pat, p.config)
                    with jax.default_matmul_precision("highest"):  # no TF32 in the oracle
                        want = _grads(*(x.astype(jnp.float32) for x in (q, k, v)), ct, pat, "reference")
                    err = {key: float(jnp.max(jnp.abs(g.astype(jnp.float32) - w))) for key, g, w in
                           zip(("out", "dq", "dk", "dv"), got, want)}  # fmt: skip
                    ok = all(e <= TOL[jnp.dtype(dtype).name] for e in err.values())
                    ok = ok and not any(bool(jnp.isnan(g.astype(jnp.float32)).any()) for g in got)
                    rows.append(dict(n=n, pattern=name, dtype=jnp.dtype(dtype).name, max_abs_err=err, ok=ok))
                except Exception as e:  # noqa: BLE001  (a failure is a result)
                    rows.append(dict(n=n, pattern=name, dtype=jnp.dtype(dtype).name, ok=False, error=repr(e)[:300]))
                log(f"check n={n} {name} {jnp.dtype(dtype).name}: {'ok' if rows[-1]['ok'] else 'FAIL'}")
    return rows


def _grads(q, k, v, ct, pattern, config):
    @jax.jit
    def run(q, k, v, ct, pattern):
        scale = q.shape[-1] ** -0.5
        if config == "reference":
            fn = lambda q, k, v: reference_attention(q, k, v, pattern, scale)[0]  # noqa: E731
        else:
            fn = lambda q, k, v: kernels.pallas_attention(q, k, v, pattern, scale, config=config)[0]  # noqa: E731
        out, vjp = jax.vjp(fn, q, k, v)
        return (out,) + vjp(ct.astype(out.dtype))

    return run(q, k, v, ct, pattern)


# -- timing -----------------------------------------------------------------------------------------------------


def _time(fn, args, reps: int) -> float:
    return benchlib.time_fn(fn, *args, repeats=reps)


def _fwd_bwd(attn):
    def loss(q, k, v):
        return jnp.sum(attn(q, k, v).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def methods(p: Plan, n: int, d: int):
    """name -> (attention fn (q, k, v) -> out, pattern name for the pair count)."""
    scale = d**-0.5
    out = {}
    if not p.interpret:
        for causal in (False, True):
            out[f"cudnn_{'causal' if causal else 'dense'}"] = (
                lambda q, k, v, c=causal: jax.nn.dot_product_attention(q, k, v, is_causal=c, implementation="cudnn"),
                "causal" if causal else "dense",
            )
    from jax.experimental.pallas.ops.gpu import attention as jax_flash

    for causal in (False, True):
        out[f"jax_pallas_{'causal' if causal else 'dense'}"] = (
            lambda q, k, v, c=causal: jax_flash.mha(q, k, v, None, sm_scale=scale, causal=c, interpret=p.interpret),
            "causal" if causal else "dense",
        )
    nl = neighbours3(n)  # the measured basis of "no neighbour kernel": K = 3 rows need a gather, not 64-wide tiles
    out["xla_neighbours3"] = (lambda q, k, v: xla_attention(q, k, v, nl, scale)[0], "neighbours3")
    for name, pat in patterns(n).items():
        out[f"ours_{name}"] = (
            lambda q, k, v, pat=pat: kernels.pallas_attention(q, k, v, pat, scale, config=p.config)[0],
            name,
        )
    # Which ABCA core implementation to make the GPU default: the packed XLA path or the patterns through our kernels.
    for impl in ("packed", "pallas"):
        out[f"abca_core_{impl}"] = (abca_core(n, d, p.heads, impl), "abca256")
    return out


def timings(p: Plan, t_start: float, log) -> list[dict]:
    rows = []
    for n in p.lengths:
        pairs = {name: count_pairs(pat, n) for name, pat in patterns(n).items()}
        pairs["neighbours3"] = 3 * n - 3
        for d in p.head_dims:
            ks = jax.random.split(jax.random.key(d), 3)
            qkv = [jax.random.normal(x, (1, n, p.heads, d), jnp.float32).astype(jnp.bfloat16) for x in ks]
            for name, (attn, pname) in methods(p, n, d).items():
                for mode in ("fwd", "fwd+bwd"):
                    row = dict(method=name, pattern=pname, n=n, d=d, heads=p.heads, mode=mode, pairs=pairs[pname])
                    if time.perf_counter() - t_start > p.budget_s:
                        rows.append(dict(row, skipped="time budget"))
                        continue
                    fn = jax.jit(attn) if mode == "fwd" else _fwd_bwd(attn)
                    try:
                        sec = _time(fn, qkv, p.reps)
                        flops = 4.0 * d * pairs[pname] * p.heads * (1.0 if mode == "fwd" else 3.5)
                        # HBM traffic floor of a forward: q, k, v read once and out written once (bf16).
                        gbps = 4 * n * p.heads * d * 2 / sec / 1e9 if mode == "fwd" else None
                        rows.append(dict(row, ms=sec * 1e3, tflops=flops / sec / 1e12, min_gb_per_s=gbps))
                        tf = flops / sec / 1e12
                        log(f"{name:22s} n={n:6d} d={d:3d} {mode:7s} {sec * 1e3:9.3f} ms {tf:7.1f} TF/s")
                    except Exception as e:  # noqa: BLE001
                        rows.append(dict(row, error=repr(e)[:300]))
                        log(f"{name} n={n} d={d} {mode}: {type(e).__name__}")
    return rows


def acceptance(rows: list[dict]) -> list[dict]:
    """At 16k: ours' rate per computed pair over cuDNN dense's, and the window speed-up vs the pair-count ratio."""
    out = []
    get = {(r["method"], r["n"], r["d"], r["mode"]): r for r in rows if "tflops" in r}
    for (method, n, d, mode), r in get.items():
        base = get.get(("cudnn_dense", n, d, mode))
        if not method.startswith("ours_") or base is None or n != 16384:
            continue
        ratio = r["tflops"] / base["tflops"]
        speedup, pair_ratio = base["ms"] / r["ms"], base["pairs"] / r["pairs"]
        out.append(dict(method=method, n=n, d=d, mode=mode, rate_vs_cudnn=ratio, speedup=speedup,
                        pair_ratio=pair_ratio, ok=ratio >= 0.5))  # fmt: skip
    return out


def markdown(result: dict) -> str:
    lines = [f"# GPU check ({result['device']}, jax {result['jax']}, {result['date']})", ""]
    fails = [c for c in result["correctness"] if not c["ok"]]
    lines += [f"Correctness: {len(result['correctness']) - len(fails)}/{len(result['correctness'])} cases within "
              f"tolerance {TOL}.", ""]  # fmt: skip
    lines += ["| method | pattern | n | d | mode | ms | TFLOP/s |", "|---|---|---|---|---|---|---|"]
    for r in result["timings"]:
        why = r.get("skipped") or r.get("error", "")[:60]
        val = f"{r['ms']:.3f} | {r['tflops']:.1f}" if "ms" in r else f"{why} | -"
        lines.append(f"| {r['method']} | {r['pattern']} | {r['n']} | {r['d']} | {r['mode']} | {val} |")
    lines += ["", "| ours (16k) | d | mode | rate / cuDNN dense | speed-up | pair ratio | >= 0.5 |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for a in result["acceptance"]:
        lines.append(f"| {a['method']} | {a['d']} | {a['mode']} | {a['rate_vs_cudnn']:.2f} | {a['speedup']:.2f} | "
                     f"{a['pair_ratio']:.2f} | {a['ok']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpret mode, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new timings after this many seconds")
    ap.add_argument("--lengths", type=int, nargs="+", help="timed n (default 16384 4096 8192 32768, 16k first)")
    ap.add_argument("--head-dims", type=int, nargs="+", help="timed d (default 64 128)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    p = plan(args.dry_run, args.budget_s)
    if args.lengths:
        p = dataclasses.replace(p, lengths=tuple(args.lengths))
    if args.head_dims:
        p = dataclasses.replace(p, head_dims=tuple(args.head_dims))
    log = lambda s: print(f"[{time.perf_counter() - t_start:7.1f}s] {s}", flush=True)  # noqa: E731
    dev = jax.devices()[0]
    log(f"device {dev.device_kind} ({jax.default_backend()}), dry_run={args.dry_run}")
    if not args.dry_run and jax.default_backend() != "gpu":
        raise SystemExit("no GPU: run with --dry-run on CPU")
    result = dict(device=dev.device_kind, backend=jax.default_backend(), jax=jax.__version__,
                  python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  dry_run=args.dry_run)  # fmt: skip
    result["correctness"] = correctness(p, log)
    try:
        result["timings"] = timings(p, t_start, log)
    except Exception:  # noqa: BLE001  (keep the correctness results)
        result["timings"] = []
        result["timing_error"] = traceback.format_exc()[-2000:]
    result["acceptance"] = acceptance(result["timings"])
    result["wall_s"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gpu_check_dry_run" if args.dry_run else "gpu_check")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    log(f"wrote {stem}.json/.md in {math.ceil(result['wall_s'])} s")
    return result


if __name__ == "__main__":
    main()
