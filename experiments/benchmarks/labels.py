"""Label-attention acceptance benchmark (docs/labels.md): the hard-phase attention core against dense and window
attention.

Command (CPU, fp32, measured side by side in one run):
  python -m experiments.benchmarks.labels
  python -m experiments.benchmarks.labels --smoke   # n=1024 radius 256, a minute

Rows: `labels` = routing head MLP(x) -> top-k -> bitmasks -> bucket layout -> bucket-sorted attention ->
log-sum-exp merge (+ landmark pass), from hidden states x and projected q, k, v (shared projections excluded);
`dense` = jax.nn.dot_product_attention; `window` = the plain sliding window of the same radius through
`sparse_attn.attention(..., implementation="xla")`; `window_equal_pairs` = a plain window whose allowed pairs equal
the label pattern's. Acceptance at n=8192, radius 2048, landmarks every 512, d=32, k=2, B=1, H=4, D=64:
fwd+bwd >= 5x faster than dense, >= 3x faster than window, <= 3x slower than window_equal_pairs, and compiled
memory (temp + args + outputs) >= 4x lower than dense.

Writes: experiments/results/bench_labels.{md,json} (--tag names them).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

import sparse_attn
from sparse_attn.executors.labels.bucketed import bucketed_attention, default_reach
from sparse_attn.patterns import sliding_window
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli


def equal_pairs_radius(n: int, pairs_per_head: float) -> int:
    """The window radius whose allowed pairs (boundary effects included) are closest to `pairs_per_head`."""

    def pairs(r):
        i = jnp.arange(n)
        return float(jnp.sum(jnp.minimum(i + r, n - 1) - jnp.maximum(i - r, 0) + 1))

    lo, hi = 0, n - 1  # pairs(r) increases with r: bisect for the first r reaching the target
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if pairs(mid) < pairs_per_head else (lo, mid)
    if lo > 0 and abs(pairs(lo - 1) - pairs_per_head) < abs(pairs(lo) - pairs_per_head):
        return lo - 1
    return lo


def draw_pattern(path: str, n: int = 256, radius: int = 32, landmark_every: int = 64, d: int = 8, k: int = 2):
    """Draws the hard label pattern of a random router (window ∪ landmarks ∪ self, filtered by shared labels)."""
    from sparse_attn import viz
    from sparse_attn.patterns.labels.pattern import LabelPattern

    base = BaseGraph(radius=radius, landmark_every=landmark_every)
    r = jax.random.normal(jax.random.PRNGKey(1), (1, 1, n, d))
    pattern = LabelPattern(bits_lib.pack_labels(bits_lib.top_k_labels(r, k), d), None, base)
    title = f"labels: n={n}, radius {radius}, landmarks every {landmark_every}, d={d}, k={k}"
    return viz.plot_mask(jax.device_get(pattern.to_dense())[0, 0], path, title=title)


@cli.entry_point
def main(argv=None):
    ap = cli.ArgumentParser(__doc__)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--radius", type=int, default=2048)
    ap.add_argument("--landmark-every", type=int, default=512)
    ap.add_argument("--num-labels", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--router-hidden", type=int, default=64)
    ap.add_argument("--block", type=int, default=128)
    benchlib.add_timing_args(ap, heads=4)
    ap.add_argument("--smoke", action="store_true", help="n=1024, radius 256, landmarks every 128")
    ap.add_argument("--png", default=None, help="only draw a real label pattern (n=256) to this PNG and exit")
    args = ap.parse_args(argv)
    if args.png:
        return draw_pattern(args.png)
    if args.smoke:
        args.n, args.radius, args.landmark_every, args.repeats = 1024, 256, 128, 3
    n, h, dh, d, k = args.n, args.heads, args.head_dim, args.num_labels, args.top_k
    dm = h * dh
    base = BaseGraph(radius=args.radius, landmark_every=args.landmark_every)
    reach = default_reach(n, base, d, k)

    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    x = jax.random.normal(keys[0], (1, n, dm), jnp.float32)
    # Random routing: orthonormal hidden units (i.i.d. activations for i.i.d. x) and orthonormal output columns
    # orthogonal to the all-ones vector (so GELU's positive mean gives no label a constant edge): every label gets
    # the same, uncorrelated logit distribution and buckets are balanced up to sampling noise.
    w1 = jnp.linalg.qr(jax.random.normal(keys[1], (dm, args.router_hidden), jnp.float32))[0]
    w2 = jax.random.normal(keys[2], (args.router_hidden, d), jnp.float32)
    w2 = jnp.linalg.qr(w2 - jnp.mean(w2, axis=0, keepdims=True))[0]
    q, kk, v = (jax.random.normal(kq, (1, n, h, dh), jnp.float32) for kq in keys[3:])

    def label_core(x, w1, w2, q, kk, v):
        r = (jax.nn.gelu(x @ w1) @ w2)[:, None]  # routing head [B, 1, N, d] (random weights: random routing)
        labels = bits_lib.top_k_labels(jax.lax.stop_gradient(r), k)
        out, _, info = bucketed_attention(q, kk, v, labels, num_labels=d, base=base, block=args.block, reach=reach)
        return out, info

    _, info = jax.jit(label_core)(x, w1, w2, q, kk, v)
    pairs_per_head = float(jnp.sum(info["keys"]))
    overflow = int(info["overflow"])
    deg = info["keys"].astype(jnp.float32) - 1
    r_eq = equal_pairs_radius(n, pairs_per_head)
    label_extra = dict(
        reach=reach,
        overflow=overflow,
        pairs_per_head=pairs_per_head,
        mean_degree=float(jnp.mean(deg)),
        max_degree=float(jnp.max(deg)),
        frac_disconnected=float(jnp.mean(deg == 0)),
    )
    print(f"labels: {label_extra}; equal-pairs window radius {r_eq}", flush=True)

    win = sliding_window(n, args.radius)
    win_eq = sliding_window(n, r_eq)
    runs = [
        ("labels", "bucketed", lambda *a: label_core(*a)[0], (x, w1, w2, q, kk, v), pairs_per_head, label_extra),
        ("dense", "xla", lambda q, kk, v: jax.nn.dot_product_attention(q, kk, v), (q, kk, v), float(n) * n, {}),
        ("window", "xla", lambda q, kk, v: sparse_attn.attention(q, kk, v, win, implementation="xla"), (q, kk, v),
         None, dict(radius=args.radius)),
        ("window_equal_pairs", "xla", lambda q, kk, v: sparse_attn.attention(q, kk, v, win_eq, implementation="xla"),
         (q, kk, v), None, dict(radius=r_eq)),
    ]  # fmt: skip
    rows = []
    for method, impl, fn, fargs, pairs, extra in runs:
        if pairs is None:
            pairs = float(sparse_attn.patterns.pattern_stats(win if method == "window" else win_eq, dh)["pairs"])
        row = benchlib.measure(
            method, impl, n, fn, fargs, repeats=args.repeats, flops=4.0 * pairs * dh * h, extra=extra
        )
        rows.append(row)
        print(f"{method}: fwd {row.fwd_s * 1e3:.1f} ms, fwd+bwd {row.fwd_bwd_s * 1e3:.1f} ms, "
              f"{row.mem_bytes / 2**20:.1f} MiB", flush=True)  # fmt: skip
    benchlib.add_ratios(rows)
    by = {r.mechanism: r for r in rows}
    lab = by["labels"]
    acceptance = dict(
        vs_dense_fwd_bwd=by["dense"].fwd_bwd_s / lab.fwd_bwd_s,
        vs_window_fwd_bwd=by["window"].fwd_bwd_s / lab.fwd_bwd_s,
        slowdown_vs_equal_pairs_window=lab.fwd_bwd_s / by["window_equal_pairs"].fwd_bwd_s,
        memory_vs_dense=by["dense"].mem_bytes / lab.mem_bytes,
    )
    acceptance["pass"] = bool(
        acceptance["vs_dense_fwd_bwd"] >= 5
        and acceptance["vs_window_fwd_bwd"] >= 3
        and acceptance["slowdown_vs_equal_pairs_window"] <= 3
        and acceptance["memory_vs_dense"] >= 4
        and overflow == 0
    )
    table = benchlib.format_table(rows)
    command = "python -m experiments.benchmarks.labels" + (
        " " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else ""
    )
    print(table)
    print({k2: (round(v2, 2) if isinstance(v2, float) else v2) for k2, v2 in acceptance.items()})
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, "bench_labels" + ("_smoke" if args.smoke else ""))
    config = dict(vars(args), acceptance=acceptance)
    benchlib.write_report(rows, stem, command, config, notes=f"acceptance: {acceptance}")
    return rows, acceptance


if __name__ == "__main__":
    main()
