"""Mask-function patterns (`patterns.from_mask_fn`) against the hand-built patterns of the same masks and dense.

Command (CPU):
  python -m experiments.benchmarks.mask_fn --build-n 4096 16384 131072 --n 16384
On a GPU (a stage of `experiments.gpu.session`: the kernels, their tiles reading the stored partial-tile masks):
  python -m experiments.benchmarks.mask_fn --build-n 16384 131072 --n 16384 --impl pallas --tag gpu_mask_fn

Part 1, build, all jitted (median wall time after a warm-up call; compile time apart):
`from_mask_fn(and_masks(causal_mask, sliding_window_mask(r)), n, n)` with blocks classified by interval bounds, and
with `exhaustive=True` by evaluating every index pair; `patterns.sliding_window(n, r, causal=True)` (O(n) per-token
bounds, no block lists) and its 128-token block lists (`BlockLayout.from_intervals`: the work `from_mask_fn` does).
Peak memory is the build's compiled memory (XLA memory analysis: temp + arguments + outputs), checked to stay below
an n x n bool array (n^2 bytes) wherever n^2 exceeds 4 exhaustive-classification chunks
(`mask_pattern.CHUNK_ELEMENTS`, about 2 of which are live at once).
Part 2, fwd+bwd at `--n` on the `--impl` executor ("xla" or "pallas"), side by side in one run: the causal window,
causal and document masks as mask functions and as hand-built `Intervals` (`sliding_window`, `causal`,
`document_mask`), and dense causal `jax.nn.dot_product_attention`; speedups and memory ratios against dense.

Writes: experiments/results/bench_mask_fn.{md,json}.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn import patterns
from sparse_attn.attention import attention
from sparse_attn.patterns import mask_fns as M
from sparse_attn.patterns.mask_pattern import CHUNK_ELEMENTS
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli


def _timed_build(build, repeats: int) -> dict:
    """{compile_s, build_s (median), peak_bytes} of a jitted zero-argument build."""
    jitted = jax.jit(build)
    t0 = time.perf_counter()
    compiled = jitted.lower().compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    peak = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
    return dict(compile_s=compile_s, build_s=benchlib.time_fn(compiled, repeats=repeats), peak_bytes=peak)


def build_rows(ns, radius: int, repeats: int) -> list[dict]:
    rows = []
    window = M.and_masks(M.causal_mask, M.sliding_window_mask(radius))
    for n in ns:
        cap = (min(2 + radius // 128, -(-n // 128)), 1)
        for name, build in (
            ("from_mask_fn", lambda n=n, cap=cap: patterns.from_mask_fn(window, n, n, capacity=cap)),
            ("from_mask_fn exhaustive",
             lambda n=n, cap=cap: patterns.from_mask_fn(window, n, n, capacity=cap, exhaustive=True)),
            ("sliding_window", lambda n=n: patterns.sliding_window(n, radius, causal=True)),
            ("sliding_window + BlockLayout", lambda n=n, cap=cap: patterns.BlockLayout.from_intervals(
                patterns.sliding_window(n, radius, causal=True), 128, 128, capacity=cap[0])),
        ):
            row = dict(kind=name, n=n, **_timed_build(build, repeats))
            # Below 4 chunks the chunk itself may exceed n^2 (nothing to check there).
            if n * n > 4 * CHUNK_ELEMENTS and row["peak_bytes"] >= n * n:
                raise SystemExit(f"{name} at n={n} compiled to {row['peak_bytes']} bytes >= n^2: an n x n mask")
            rows.append(row)
            print(f"  build {name:28s} n={n:7d} {row['build_s'] * 1e3:10.2f} ms  compile {row['compile_s']:.1f} s  "
                  f"peak {row['peak_bytes'] / 2**20:8.1f} MiB", flush=True)  # fmt: skip
    return rows


def attention_rows(n: int, radius: int, heads: int, head_dim: int, repeats: int, impl: str = "xla"
                   ) -> list[benchlib.Row]:  # fmt: skip
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(x, (1, n, heads, head_dim), jnp.float32) for x in ks)
    ids = np.repeat(np.arange(8), n // 8)[None].astype(np.int32)  # 8 equal documents
    cases = {
        "window": (M.and_masks(M.causal_mask, M.sliding_window_mask(radius)),
                   patterns.sliding_window(n, radius, causal=True)),
        "causal": (M.causal_mask, patterns.causal(n)),
        "document": (M.and_masks(M.causal_mask, M.document_mask(ids)),
                     patterns.document_mask(jnp.asarray(ids), causal=True)),
    }  # fmt: skip
    dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    rows = [benchlib.measure("dense", "jax.nn", n, dense, (q, k, v), repeats=repeats)]
    benchlib.print_row(rows[-1], 22)
    for name, (mask_fn, hand) in cases.items():
        built = patterns.from_mask_fn(mask_fn, n, n, batch=1 if name == "document" else None)
        for kind, pattern in ((f"{name}_mask_fn", built), (f"{name}_hand_built", hand)):
            fn = lambda q, k, v, p=pattern: attention(q, k, v, p, implementation=impl)  # noqa: E731
            st = patterns.pattern_stats(hand, head_dim, heads=heads)
            rows.append(benchlib.measure(kind, impl, n, fn, (q, k, v), repeats=repeats, flops=float(st["flops"]),
                                         extra=dict(mean_keys=float(st["mean_keys"]))))  # fmt: skip
            benchlib.print_row(rows[-1], 22)
    return benchlib.add_ratios(rows)


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--build-n", type=int, nargs="+", default=[4096, 16384, 131072])
    p.add_argument("--n", type=int, default=16384, help="length of the fwd+bwd comparison")
    p.add_argument("--radius", type=int, default=256)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--impl", choices=("xla", "pallas"), default="xla", help="executor of part 2")
    benchlib.add_timing_args(p, repeats=3, tag="bench_mask_fn", heads=1)
    args = p.parse_args(argv)
    command = benchlib.announce("experiments.benchmarks.mask_fn", argv, args.out_dir)
    built = build_rows(args.build_n, args.radius, args.repeats)
    rows = attention_rows(args.n, args.radius, args.heads, args.head_dim, args.repeats, args.impl)
    base = os.path.join(args.out_dir, args.tag)
    head = "| pattern | n | build ms | compile s | peak MiB | peak / n^2 bytes |\n|---|---|---|---|---|---|\n"
    build_table = head + "\n".join(
        f"| {r['kind']} | {r['n']} | {r['build_s'] * 1e3:.2f} | {r['compile_s']:.1f} | {r['peak_bytes'] / 2**20:.1f} | "
        f"{r['peak_bytes'] / r['n'] ** 2:.4f} |" for r in built)  # fmt: skip
    table = benchlib.write_report(rows, base, command, vars(args), notes="Build (jitted, compile apart):\n\n" +
                                  build_table)  # fmt: skip
    with open(base + ".json") as f:
        data = json.load(f)
    data["build"] = built
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=2)
    print(table + "\n\n" + build_table)
    return rows, built


if __name__ == "__main__":
    main()
