"""Decode speed and cache memory against context length: dense, local window, labels, ABCA (docs/generation.md).

    nice -n 10 .venv/bin/python -m experiments.benchmarks.decode            # CPU: 1k..64k, a few steps per point

For each mechanism and context length n, a `TransformerLM` (all layers that mechanism) gets caches for `max_len = n`
and decodes a few tokens at positions n - steps .. n - 1 with the jitted one-token step: the caches are initialised
as if the context were there (the step's work depends on the cache shapes and the position, not on the cached
values), so no point decodes the whole context. Reported: median seconds per token (after one warm-up step that
compiles), tokens/s and the caches' bytes (all layers). Writes `experiments/results/bench_decode.{md,json,png}`.

Writes: experiments/results/bench_decode.{md,json,png}.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.decode import LMDecoder
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import DenseAttention, LocalAttention
from sparse_attn.studies import cli
from sparse_attn.studies.mechanisms import Context, attention_config

RESULTS = os.path.join(os.path.dirname(__file__), "results")
WINDOW = 256


def mechanisms(window: int, n: int = 1 << 16) -> dict:
    ctx = Context(seq_len=n, window=window)
    return {
        "dense": DenseAttention(),
        "local": LocalAttention(radius=window),
        "labels": attention_config("labels", ctx, landmark_every=window, phase="hard"),
        # fixed anchors every `window` tokens, zones capped at the same length
        "abca": attention_config("abca_fixed", ctx),
    }


def measure(name: str, attention, n: int, *, layers: int, dim: int, heads: int, steps: int) -> dict:
    cfg = TransformerConfig(vocab_size=256, model_dim=dim, num_heads=heads, num_layers=layers, mlp_dim=4 * dim,
                            attention=attention)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    dec = LMDecoder(model, batch=1, max_len=n)
    caches = dec.init_caches()
    tok = jnp.zeros((1,), jnp.int32)
    times = []
    for i, pos in enumerate(range(n - steps - 1, n)):
        t0 = time.perf_counter()
        logits, caches = dec.step(caches, tok, pos)
        jax.block_until_ready(logits)
        if i:  # step 0 compiles
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    return {"mechanism": name, "n": n, "s_per_token": s, "tokens_per_s": 1.0 / s, "cache_bytes": dec.cache_bytes()}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib  # noqa: PLC0415 — only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["mechanism"] for r in rows):
        rs = [r for r in rows if r["mechanism"] == name]
        axes[0].loglog([r["n"] for r in rs], [r["s_per_token"] * 1e3 for r in rs], "o-", label=name)
        axes[1].loglog([r["n"] for r in rs], [r["cache_bytes"] / 2**20 for r in rs], "o-", label=name)
    axes[0].set(xlabel="context length n", ylabel="ms per decoded token", title="decode time per token")
    axes[1].set(xlabel="context length n", ylabel="cache MiB (all layers)", title="cache memory")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@cli.entry_point
def main(argv=None) -> list[dict]:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--lengths", default="1024,4096,16384,65536")
    parser.add_argument("--mechanisms", default="dense,local,labels,abca")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per point (after one that compiles)")
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--out", default=os.path.join(RESULTS, "bench_decode"))
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    table = mechanisms(args.window)
    names = args.mechanisms.split(",")
    if unknown := [m for m in names if m not in table]:
        parser.error(f"--mechanisms: unknown {', '.join(unknown)}; choose from {', '.join(table)}")
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    rows = []
    for name in names:
        for n in lengths:
            row = measure(name, table[name], n, layers=args.layers, dim=args.dim, heads=args.heads, steps=args.steps)
            rows.append(row)
            print(f"{name:8s} n={n:6d}  {row['s_per_token'] * 1e3:8.2f} ms/token  {row['tokens_per_s']:8.1f} tok/s  "
                  f"cache {row['cache_bytes'] / 2**20:9.3f} MiB", flush=True)
    meta = {"command": "python -m experiments.benchmarks.decode " + " ".join(argv), "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind), "cpu_count": os.cpu_count(), "jax": jax.__version__,
            "machine": platform.machine(), "load_avg_1m": os.getloadavg()[0],
            "model": f"{args.layers} layers x {args.dim}, {args.heads} heads, batch 1, fp32", "window": args.window}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# Decode benchmark\n\n{meta}\n", "| mechanism | n | ms / token | tokens/s | cache MiB |", "|---|---|---|---|---|"]
    lines += [f"| {r['mechanism']} | {r['n']} | {r['s_per_token'] * 1e3:.2f} | {r['tokens_per_s']:.1f} | "
              f"{r['cache_bytes'] / 2**20:.3f} |" for r in rows]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(rows, args.out + ".png")
    return rows


if __name__ == "__main__":
    main()
