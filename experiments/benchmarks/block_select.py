"""MoBA and NSA cores against dense causal attention, measured side by side in one run.

Command (CPU, fp32; the numbers in docs/moba.md and docs/nsa.md):
  python -m experiments.benchmarks.block_select --n 4096 16384

At length n, both run at about 1/16 of causal dense's pairs or fewer (their registered benchmark cores:
`sparse_attn.mechanisms.moba.bench_config`, `nsa.bench_config`):
MoBA with key blocks of n / 128 and the top-4 (own included: ~3.5 n / 128 keys a query); NSA with compressed
tokens every n / 128 (blocks of twice that), selection blocks of n / 256, top-4, and a window of n / 256. The
cores are what the layers compute from projected q, k, v [B, N, H, D] (NSA: per-branch k, v and the gates), on
the "xla" executor; their projections are excluded. Forward+backward differentiates w.r.t. q, k, v (and NSA's
gates and compression MLPs). Dense is `jax.nn.dot_product_attention(is_causal=True)` on q, k, v of the same shape. At
16384 every method runs one head (dense's N x N logits must fit), at 4096 four. Acceptance: fwd+bwd >= 10x faster than dense at 16384.

Writes: experiments/results/bench_block_select.{md,json}.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from sparse_attn import registry
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli
from sparse_attn.studies.bench import BenchSpec


def _inputs(n: int, batch: int, heads: int, head_dim: int, count: int):
    keys = jax.random.split(jax.random.PRNGKey(0), count)
    return tuple(jax.random.normal(kk, (batch, n, heads, head_dim), jnp.float32) for kk in keys)


def run(args) -> list[benchlib.Row]:
    rows = []
    for n in args.n:
        heads = args.heads if n <= 4096 else 1
        d = args.head_dim
        dense_keys = (n + 1) / 2
        q, k, v = _inputs(n, args.batch, heads, d, 3)
        dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        rows.append(benchlib.measure("dense", "jax.nn", n, dense, (q, k, v), repeats=args.repeats,
                                     flops=4.0 * args.batch * heads * n * dense_keys * d))  # fmt: skip
        benchlib.print_row(rows[-1], 6, extra=True)
        for name in ("moba", "nsa"):
            spec = BenchSpec(n=n, batch=args.batch, heads=heads, head_dim=d, dtype="float32", radius=0, impl="xla",
                             key=jax.random.PRNGKey(0), causal=True)  # fmt: skip
            core = registry.bench_cores()[name](spec)
            keys = float(jax.jit(core.fn)(*core.args)[1]) / n
            st = {"keys_per_query": keys, "pairs_vs_dense": keys / dense_keys}
            rows.append(benchlib.measure(name, "xla", n, lambda *a, fn=core.fn: fn(*a)[0], core.args,
                                         repeats=args.repeats, flops=4.0 * args.batch * heads * n * keys * d,
                                         extra=st, grad_argnums=core.grad_argnums))  # fmt: skip
            benchlib.print_row(rows[-1], 6, extra=True)
    return benchlib.add_ratios(rows)


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--head-dim", type=int, default=64)
    benchlib.add_timing_args(p, tag="bench_block_select", batch=1, heads=4)
    args = p.parse_args(argv)
    command = benchlib.announce("experiments.benchmarks.block_select", argv, args.out_dir)
    rows = run(args)
    print(benchlib.format_table(rows))
    base = os.path.join(args.out_dir, args.tag)
    benchlib.write_report(rows, base, command, vars(args))
    print(f"wrote {base}.json, {base}.md")
    return rows


if __name__ == "__main__":
    main()
