"""Attention benchmark: mechanisms' benchmark cores against dense attention measured side by side in one run.

Command (CPU):
  python -m experiments.benchmarks.attention --n 1024 2048 4096 --mechanisms window longformer bigbird

For each n it times forward and forward+backward (median of repeats after warm-up), reads XLA's compiled memory
analysis (temp + arguments + outputs) of forward+backward, counts attention FLOPs from the pattern, and reports
speedup and memory ratio against dense `jax.nn.dot_product_attention` measured in the same run. Writes a markdown
table, JSON and a log-log PNG under --out-dir.

Writes: experiments/results/bench_attention.{md,json,png} (table, rows, log-log plot).
"""

from __future__ import annotations

import os

import jax

import sparse_attn
from sparse_attn import patterns, registry
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli
from sparse_attn.studies.bench import BenchSpec, qkv


def _dense(spec: BenchSpec) -> registry.BenchCore:
    fn = lambda q, k, v: (jax.nn.dot_product_attention(q, k, v), None)  # noqa: E731
    return registry.BenchCore(fn, qkv(spec), patterns.dense(spec.n))


def cores() -> dict:
    """jax.nn's dense (the baseline every row is measured against) and every mechanism's benchmark cores
    (`sparse_attn.registry.Mechanism.bench`)."""
    return {"dense": _dense, **registry.bench_cores()}


def _impls(core: str, args) -> list[str]:
    """What a core runs under: dense is jax.nn's; every other core each of `--impls` (a mechanism's own executors,
    e.g. ABCA's "packed", are named there too)."""
    return ["xla"] if core == "dense" else args.impls


def run(args) -> list[benchlib.Row]:
    rows = []
    for n in args.n:
        table = cores()
        for name in ["dense"] + [m for m in args.mechanisms if m != "dense"]:
            impls = _impls(name, args)
            for impl in impls:
                if impl == "reference" and n > 4096:
                    continue  # the oracle is O(n^2) memory by design
                spec = BenchSpec(
                    n, args.batch, args.heads, args.head_dim, args.dtype, args.radius, impl, jax.random.PRNGKey(0)
                )
                core = table[name](spec)
                if core.pattern is not None:
                    st = patterns.pattern_stats(core.pattern, args.head_dim, batch=args.batch, heads=args.heads)
                    flops, mean_keys = float(st["flops"]), float(st["mean_keys"])
                else:  # a learned pattern: the core counts its pairs
                    mean_keys = float(jax.jit(core.fn)(*core.args)[1]) / n
                    flops = 4.0 * args.batch * args.heads * n * mean_keys * args.head_dim
                row = benchlib.measure(
                    name,
                    "jax.nn" if name == "dense" else impl,
                    n,
                    lambda *a, fn=core.fn: fn(*a)[0],
                    core.args,
                    repeats=args.repeats,
                    flops=flops,
                    extra=dict(density=mean_keys / n, mean_keys=mean_keys),
                    grad_argnums=core.grad_argnums,
                )
                rows.append(row)
                benchlib.print_row(row)
    return benchlib.add_ratios(rows)


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--mechanisms", nargs="+", default=["window", "longformer", "bigbird"], choices=sorted(cores()),
                   help="benchmark cores of the registered mechanisms")
    accel = jax.default_backend() in ("gpu", "tpu")
    p.add_argument(
        "--impls",
        nargs="+",
        default=["xla", "pallas"] if accel else ["xla"],
        help="executors to time (ABCA's cores also take 'packed'); 'pallas' on CPU runs in interpret mode "
             "(keep n <= 1024)",
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
