"""Non-crossing routing attention core against dense attention, measured side by side in one run.

Command (CPU, fp32; the numbers in docs/noncrossing.md):
  python -m experiments.benchmarks.noncrossing --n 4096 16384

The routing core is what `NoncrossingAttention.core` computes from the layer's hidden states x [B, N, 256] and the
projected q, k, v [B, N, 4, 64]: router pair scores, T defect-pair layers of TL diagrams (one per head), key rows
[self, top partner, bottom partner] with creator gates, and attention over them. The layer's shared Q/K/V/O
projections are excluded. Forward+backward differentiates w.r.t. x, q, k, v and the router's parameters. Dense is
`jax.nn.dot_product_attention` on the same q, k, v (skipped above --dense-max-n: its N x N logits). Acceptance
(docs/noncrossing.md): fwd+bwd speedup >= 20x at n=4096, and routing time(16384) <= 5 x time(4096).

Writes: experiments/results/bench_noncrossing.{md,json}.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli
from sparse_attn.studies.mechanisms import Context, attention_config


def noncrossing_core(n: int, args, router: str):
    """(fn, args, stats) for the routing core at length n."""
    cfg = attention_config(
        "noncrossing_defect", Context(seq_len=n, window=n),
        router=router,
        num_route_layers=args.route_layers,
        router_dim=args.router_dim,
        doubled=args.doubled and router == "defect_pair",
    )
    module = cfg.make(args.model_dim, args.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(module, nnx.Param)
    valid_len = jnp.full((args.batch,), n, jnp.int32)

    def fn(x, q, k, v, params):
        return nnx.merge(graphdef, params).core(x, q, k, v, valid_len)[0]

    kx, kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 4)
    shape = (args.batch, n, args.heads, args.model_dim // args.heads)
    x = jax.random.normal(kx, (args.batch, n, args.model_dim), jnp.float32)
    q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in (kq, kk, kv))
    st = jax.jit(lambda x, q, k, v, params: nnx.merge(graphdef, params).core(x, q, k, v, valid_len)[1])(
        x, q, k, v, params
    )
    return fn, (x, q, k, v, params), {key: float(val) for key, val in st.items()}


def run(args) -> list[benchlib.Row]:
    rows = []
    head_dim = args.model_dim // args.heads
    for n in args.n:
        fn, fargs, st = noncrossing_core(n, args, "defect_pair")
        if n <= args.dense_max_n:
            dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731
            rows.append(
                benchlib.measure(
                    "dense",
                    "jax.nn",
                    n,
                    dense,
                    fargs[1:4],
                    repeats=args.repeats,
                    flops=4.0 * args.batch * args.heads * n * n * head_dim,
                )
            )
            _print(rows[-1])
        for router in args.routers:
            fn, fargs, st = noncrossing_core(n, args, router)
            pairs = args.batch * args.heads * (n + st["arcs"])  # self slots + mean non-self slots per (batch, head)
            rows.append(
                benchlib.measure(
                    f"noncrossing_{router}",
                    "xla",
                    n,
                    fn,
                    fargs,
                    repeats=args.repeats,
                    flops=4.0 * pairs * head_dim,
                    extra=st,
                )
            )
            _print(rows[-1])
    return benchlib.add_ratios(rows)


def _print(row):
    print(
        f"  n={row.n} {row.mechanism:22s} fwd {row.fwd_s * 1e3:9.2f} ms  fwd+bwd {row.fwd_bwd_s * 1e3:9.2f} ms  "
        f"mem {row.mem_bytes / 2**20:8.1f} MiB  {row.extra}",
        flush=True,
    )


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument(
        "--routers", nargs="+", default=["defect_pair"], choices=["defect_pair", "brick_wall", "adjacent_topk"]
    )
    p.add_argument("--model-dim", type=int, default=256)
    p.add_argument("--route-layers", type=int, default=4)
    p.add_argument("--router-dim", type=int, default=8)
    p.add_argument("--doubled", action="store_true")
    p.add_argument("--dense-max-n", type=int, default=4096)
    benchlib.add_timing_args(p, tag="bench_noncrossing", batch=1, heads=4)
    args = p.parse_args(argv)
    command = benchlib.announce("experiments.benchmarks.noncrossing", argv, args.out_dir)
    rows = run(args)
    table = benchlib.format_table(rows)
    by = {(r.mechanism, r.n): r for r in rows}
    lines = []
    for router in args.routers:
        ns = sorted(r.n for r in rows if r.mechanism == f"noncrossing_{router}")
        if len(ns) >= 2:
            ratio = by[(f"noncrossing_{router}", ns[-1])].fwd_bwd_s / by[(f"noncrossing_{router}", ns[0])].fwd_bwd_s
            lines.append(f"noncrossing_{router}: fwd+bwd time({ns[-1]}) / time({ns[0]}) = {ratio:.2f}")
    summary = "\n".join(lines)
    print(table + "\n" + summary)
    base = os.path.join(args.out_dir, args.tag)
    benchlib.write_report(rows, base, command, vars(args), notes=summary)
    print(f"wrote {base}.json, {base}.md")
    return rows


if __name__ == "__main__":
    main()
