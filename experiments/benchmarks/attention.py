"""Attention benchmark: every method against dense attention measured side by side in one run.

Command (CPU, the README's main job):
  python -m experiments.benchmarks.attention --n 1024 2048 4096 --methods window longformer bigbird

For each n it times forward and forward+backward (median of repeats after warm-up), reads XLA's compiled memory
analysis (temp + arguments + outputs) of forward+backward, counts attention FLOPs from the pattern, and reports
speedup and memory ratio against dense `jax.nn.dot_product_attention` measured in the same run. Writes a markdown
table, JSON and a log-log PNG under --out-dir.

Writes: experiments/results/bench_attention.{md,json,png} (table, rows, log-log plot).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sparse_attn
from sparse_attn import patterns
from sparse_attn.patterns.abca import ZonePattern
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli


@dataclasses.dataclass(frozen=True)
class Spec:
    n: int
    batch: int
    heads: int
    head_dim: int
    dtype: str
    radius: int
    impl: str
    key: jax.Array


def qkv(spec: Spec):
    kq, kk, kv = jax.random.split(spec.key, 3)
    shape = (spec.batch, spec.n, spec.heads, spec.head_dim)
    dt = jnp.dtype(spec.dtype)
    return tuple(jax.random.normal(k, shape, dt) for k in (kq, kk, kv))


def _dense(spec: Spec):
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731
    return fn, qkv(spec), patterns.dense(spec.n)


def _with_pattern(pattern) -> Callable[[Spec], tuple]:
    def make(spec: Spec):
        p = pattern(spec)
        fn = lambda q, k, v: sparse_attn.attention(q, k, v, p, implementation=spec.impl)  # noqa: E731
        return fn, qkv(spec), p

    return make


def _abca_anchors(spec: Spec, random_zones: bool):
    """Anchors every 256 tokens, or zone sizes uniform in [128, 384] (the same mean 256) per batch row."""
    if not random_zones:
        return jnp.broadcast_to(jnp.arange(spec.n)[None] % 256 == 0, (spec.batch, spec.n)), 256
    rng = np.random.default_rng(0)
    mask = np.zeros((spec.batch, spec.n), bool)
    for row in mask:
        pos = 0
        while pos < spec.n:
            row[pos] = True
            pos += int(rng.integers(128, 385))
    return jnp.asarray(mask), 384


def _abca(spec: Spec, random_zones: bool = False):
    """ABCA core (anchor gather, chain handshake, zone attention) on explicit anchors."""
    from sparse_attn.modules.abca import AnchorProjections, abca_core
    from sparse_attn.patterns import abca

    mask, cap = _abca_anchors(spec, random_zones)
    zones = abca.compute_zones(abca.enforce_zone_cap(mask, None, cap)[0])
    ws = [jax.random.normal(k, (spec.heads, spec.head_dim, spec.head_dim)) / 8 for k in jax.random.split(spec.key, 3)]
    proj = AnchorProjections(*ws, rope_base=1e4)
    fn = lambda q, k, v: abca_core(q, k, v, zones, proj, max_zone=cap, implementation=spec.impl)[0]
    return fn, qkv(spec), abca.layer_intervals(zones, causal=False, max_zone=cap)


METHODS: dict[str, Callable[[Spec], tuple]] = {
    "dense": _dense,
    "dense_pattern": _with_pattern(lambda s: patterns.dense(s.n)),
    "causal": _with_pattern(lambda s: patterns.causal(s.n)),
    "window": _with_pattern(lambda s: patterns.sliding_window(s.n, s.radius)),
    "causal_window": _with_pattern(lambda s: patterns.sliding_window(s.n, s.radius, causal=True)),
    "longformer": _with_pattern(lambda s: patterns.longformer(s.n, s.radius, 2)),
    "bigbird": _with_pattern(lambda s: patterns.bigbird(s.n, s.radius, 2, 2, 64, jax.random.PRNGKey(1))),
    "abca": _abca,  # the full mechanism benchmark is experiments/benchmarks/abca.py
    "abca_random": lambda spec: _abca(spec, random_zones=True),
}


def _impls(method: str, args) -> list[str]:
    """What a method runs under: dense is jax.nn's; ABCA runs its own default executor (ZonePattern's "packed")."""
    if method == "dense":
        return ["xla"]
    if method in ("abca", "abca_random"):
        return [sparse_attn.default_implementation(pattern_type=ZonePattern)]
    return args.impls


def run(args) -> list[benchlib.Row]:
    rows = []
    for n in args.n:
        for method in ["dense"] + [m for m in args.methods if m != "dense"]:
            impls = _impls(method, args)
            for impl in impls:
                if impl == "reference" and n > 4096:
                    continue  # the oracle is O(n^2) memory by design
                spec = Spec(
                    n, args.batch, args.heads, args.head_dim, args.dtype, args.radius, impl, jax.random.PRNGKey(0)
                )
                fn, fargs, pattern = METHODS[method](spec)
                st = patterns.pattern_stats(pattern, args.head_dim, batch=args.batch, heads=args.heads)
                row = benchlib.measure(
                    method,
                    "jax.nn" if method == "dense" else impl,
                    n,
                    fn,
                    fargs,
                    repeats=args.repeats,
                    flops=float(st["flops"]),
                    extra=dict(density=float(st["density"]), mean_keys=float(st["mean_keys"])),
                )
                rows.append(row)
                print(
                    f"  n={n} {method:14s} {row.impl:8s} fwd {row.fwd_s * 1e3:8.2f} ms  "
                    f"fwd+bwd {row.fwd_bwd_s * 1e3:8.2f} ms  mem {row.mem_bytes / 2**20:8.1f} MiB",
                    flush=True,
                )
    return benchlib.add_ratios(rows)


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--methods", nargs="+", default=["window", "longformer", "bigbird"], choices=sorted(METHODS))
    accel = jax.default_backend() in ("gpu", "tpu")
    p.add_argument(
        "--impls",
        nargs="+",
        default=["xla", "pallas"] if accel else ["xla"],
        help="executors to time; 'pallas' on CPU runs in interpret mode (keep n <= 1024)",
    )
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--radius", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    benchlib.add_timing_args(p, tag="bench_attention", batch=1, heads=4)
    args = p.parse_args(argv)
    for impl in args.impls:
        if impl not in sparse_attn.available_implementations():
            p.error(f"implementation {impl!r} is not available here; have {sparse_attn.available_implementations()}")
    command = benchlib.announce("experiments.benchmarks.attention", argv, args.out_dir)
    rows = run(args)
    base = os.path.join(args.out_dir, args.tag)
    print(benchlib.write_report(rows, base, command, vars(args)))
    benchlib.plot_rows(rows, base + ".png", title=command)
    print(f"wrote {base}.json, {base}.md, {base}.png")
    return rows


if __name__ == "__main__":
    main()
