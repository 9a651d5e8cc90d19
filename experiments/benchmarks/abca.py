"""ABCA attention core against dense attention, measured side by side in one run (the acceptance in docs/abca.md).

Command (CPU, fp32; the table in docs/abca.md):
  python -m experiments.benchmarks.abca

The core is everything from the projected q, k, v [B, N, H, 64] to the attention output: zones from the explicit
anchor mask (an input array, so nothing is constant-folded), the key-major anchor gather, the boundary handshake with
its anchor re-projections, the post-handshake anchor keys/values, and zone attention in packed slots. The layer's
shared Q/K/V/O projections are excluded. Forward+backward differentiates w.r.t. q, k, v and the anchor projections.
Dense is `jax.nn.dot_product_attention` on the same q, k, v. Rows: anchors every 256 (n=4096 with H=4, n=16384
with H=1), random zone sizes uniform in [128, 384] (same mean 256), anchors every 32 with the zone cap at 256 (k is
twice a handshake page, so the many-page handshake branch runs), and the same core through the library's
block-gather executor ("xla", the worst-case-span alternative; the packed rows are "packed"). Acceptance: fwd+bwd >= 8x faster than dense
at 4096 and >= 30x at 16384, compiled memory (temp + args + outputs) >= 8x smaller at 4096.

  python -m experiments.benchmarks.abca --stages --n 4096 16384    the core's stages timed apart (docs/abca.md)
  python -m experiments.benchmarks.abca --compile --n 4096 16384   CPU seconds to lower + compile the bf16 fwd+bwd

Writes: a markdown table and JSON under experiments/results/ (bench_abca.{md,json}; --tag names them).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.modules.abca import AnchorProjections, abca_core
from sparse_attn.modules.abca.stats import abca_stats
from sparse_attn.patterns import abca
from sparse_attn.studies import bench as benchlib
from sparse_attn.studies import cli

HEAD_DIM = 64


def anchors_fixed(n: int, every: int) -> np.ndarray:
    return (np.arange(n) % every == 0)[None]


def anchors_random(n: int, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    """Zone sizes uniform in [lo, hi] (mean (lo + hi) / 2)."""
    rng = np.random.default_rng(seed)
    mask, pos = np.zeros((1, n), bool), 0
    while pos < n:
        mask[0, pos] = True
        pos += int(rng.integers(lo, hi + 1))
    return mask


def make_core(max_zone: int, implementation: str, handshake_steps: int):
    def core(q, k, v, weights, is_anchor):
        is_anchor, _ = abca.enforce_zone_cap(is_anchor, None, max_zone)
        zones = abca.compute_zones(is_anchor, None)
        proj = AnchorProjections(*weights, rope_base=10_000.0)
        return abca_core(
            q, k, v, zones, proj, max_zone=max_zone, implementation=implementation, handshake_steps=handshake_steps
        )

    return core


def measure_core(name, impl, n, heads, mask, max_zone, args) -> benchlib.Row:
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    q, k, v = (jax.random.normal(kk, (1, n, heads, HEAD_DIM), jnp.float32) for kk in ks[:3])
    weights = tuple(jax.random.normal(kk, (heads, HEAD_DIM, HEAD_DIM), jnp.float32) / 8 for kk in ks[3:])
    is_anchor = jnp.asarray(mask)
    ct = jnp.ones(q.shape, jnp.float32)
    core = make_core(max_zone, impl, args.handshake_steps)
    fwd = jax.jit(lambda q, k, v, w, a: core(q, k, v, w, a)[0])
    fb = jax.jit(jax.grad(lambda q, k, v, w, a, ct: jnp.sum(core(q, k, v, w, a)[0] * ct), argnums=(0, 1, 2, 3)))
    row = benchlib.Row(
        mechanism=name,
        impl=impl,
        n=n,
        fwd_s=benchlib.time_fn(fwd, q, k, v, weights, is_anchor, repeats=args.repeats),
        fwd_bwd_s=benchlib.time_fn(fb, q, k, v, weights, is_anchor, ct, repeats=args.repeats),
        mem_bytes=benchlib.compiled_memory(fb, q, k, v, weights, is_anchor, ct),
    )
    capped, inserted = abca.enforce_zone_cap(is_anchor, None, max_zone)
    zones = abca.compute_zones(capped, None)
    _, info = jax.jit(core)(q, k, v, weights, is_anchor)
    st = abca_stats(
        zones,
        inserted,
        info,
        causal=False,
        handshake="chain",
        handshake_steps=args.handshake_steps,
        max_anchors=None,
        slot_width=max_zone,
    )
    row.flops = 4.0 * HEAD_DIM * heads * n * float(st["keys_per_query"])  # B = 1, every token valid
    ratios = {"flops_ratio": float(st["keys_per_query"]) / n}  # vs dense (n keys per query, bidirectional)
    if "slot_keys_per_query" in st:
        ratios["slot_flops_ratio"] = float(st["slot_keys_per_query"]) / n
    row.extra = dict(heads=heads, zone_cap=max_zone, **{k: float(v) for k, v in st.items()}, **ratios)
    return row


def measure_dense(n, heads, args) -> benchlib.Row:
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(kk, (1, n, heads, HEAD_DIM), jnp.float32) for kk in ks)
    row = benchlib.measure(
        "dense",
        "jax.nn",
        n,
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v),
        (q, k, v),
        repeats=args.repeats,
        flops=4.0 * heads * n * n * HEAD_DIM,
    )
    row.extra = {"heads": heads}
    return row


def measure_stages(n: int, heads: int, every: int, args) -> dict:
    """Median CPU ms (fwd, fwd+bwd) of the anchor gather (stage 1) alone, the zone attention (stage 3) alone, and the
    whole packed core (anchors every `every`, bidirectional, zones and the cotangent as inputs); the handshake and the
    glue between stages are what the core costs beyond the two."""
    from sparse_attn.attention import attention
    from sparse_attn.patterns.abca import ZonePattern

    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    q, k, v = (jax.random.normal(kk, (1, n, heads, HEAD_DIM), jnp.float32) for kk in ks[:3])
    weights = tuple(jax.random.normal(kk, (heads, HEAD_DIM, HEAD_DIM), jnp.float32) / 8 for kk in ks[3:])
    is_anchor, ct = jnp.asarray(anchors_fixed(n, every)), jnp.ones(q.shape, jnp.float32)
    core = make_core(every, "packed", args.handshake_steps)

    def stage(name):
        def fn(q, k, v, w, a):
            if name == "core":
                return core(q, k, v, w, a)[0]
            pattern = ZonePattern(abca.compute_zones(a, None), stage=name, causal=False, max_zone=every)
            return attention(q, k, v, pattern, implementation="packed")
        return fn

    calls = {}
    for name in ("gather", "zones", "core"):
        fn = stage(name)
        fb = jax.grad(lambda q, k, v, w, a, ct, fn=fn: jnp.sum(fn(q, k, v, w, a) * ct), argnums=(0, 1, 2, 3))
        calls[name] = ((jax.jit(fn), (q, k, v, weights, is_anchor)), (jax.jit(fb), (q, k, v, weights, is_anchor, ct)))
    for (f, xs), (fb, xbs) in calls.values():  # compile and warm up
        jax.block_until_ready((f(*xs), fb(*xbs)))
    # Process CPU time per call (all threads), median over interleaved rounds: on a shared machine wall time mostly
    # measures the other processes.
    times = {name: ([], []) for name in calls}
    for _ in range(args.repeats):
        for name, pair in calls.items():
            for (f, xs), acc in zip(pair, times[name], strict=True):
                t0 = time.process_time()
                jax.block_until_ready(f(*xs))
                acc.append(1e3 * (time.process_time() - t0))
    out = {name: tuple(float(np.median(t)) for t in ts) for name, ts in times.items()}
    out["handshake+glue"] = tuple(c - g - z for c, g, z in zip(out["core"], out["gather"], out["zones"], strict=True))
    return out


def measure_compile(n: int, implementation: str | None, heads: int = 16, head_dim: int = 64) -> dict:
    """CPU seconds to lower and compile the core's fwd+bwd as the H200 run built it (bf16, B=1, causal, anchors
    every 256, zones computed eagerly and closed over, a `sum` loss): the setting where XLA constant-folded a
    [1, N, H, D] scatter-add of the backward pass (docs/abca.md, "Compile time")."""
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    q, k, v = (jax.random.normal(x, (1, n, heads, head_dim), jnp.float32).astype(jnp.bfloat16) for x in ks[:3])
    w = tuple((jax.random.normal(x, (heads, head_dim, head_dim)) / 8).astype(jnp.bfloat16) for x in ks[3:])
    zones = abca.compute_zones(jnp.asarray(anchors_fixed(n, 256)), None)

    def loss(q, k, v):
        out = abca_core(q, k, v, zones, AnchorProjections(*w), max_zone=256, causal=True, implementation=implementation)
        return jnp.sum(out[0].astype(jnp.float32))

    t0 = time.process_time()
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v)
    t1 = time.process_time()
    lowered.compile()
    return {"lower_cpu_s": t1 - t0, "compile_cpu_s": time.process_time() - t1}


def _print(r: benchlib.Row) -> None:
    print(
        f"  n={r.n} {r.mechanism:16s} {r.impl:10s} fwd {r.fwd_s * 1e3:9.1f} ms  fwd+bwd {r.fwd_bwd_s * 1e3:9.1f} ms  "
        f"mem {r.mem_bytes / 2**20:8.1f} MiB",
        flush=True,
    )


def run(args) -> list[benchlib.Row]:
    rows = []
    for n in args.n:
        heads = 4 if n <= 4096 else 1  # dense's N x N logits must fit at 16384
        rows.append(measure_dense(n, heads, args))
        _print(rows[-1])
        plan = [
            ("abca_every256", "packed", anchors_fixed(n, 256), 256),
            ("abca_random128-384", "packed", anchors_random(n, 128, 384), 384),
            # twice the anchors one handshake page holds (4 ceil(n / max_zone)): the many-page handshake branch
            ("abca_every32_cap256", "packed", anchors_fixed(n, 32), 256),
        ]
        if n <= args.blocks_max_n:
            plan.append(("abca_every256", "xla", anchors_fixed(n, 256), 256))
        for name, impl, mask, max_zone in plan:
            rows.append(measure_core(name, impl, n, heads, mask, max_zone, args))
            _print(rows[-1])
    return benchlib.add_ratios(rows)


def draw_figures(out_dir: str) -> list[str]:
    """PNGs of a real ABCA pattern (stages 1 and 3 plus the chain handshake), bidirectional and causal."""
    from sparse_attn import viz

    n, cap = 48, 8
    mask = np.zeros((1, n), bool)
    mask[0, [0, 5, 6, 13, 20, 22, 41]] = True  # explicit anchors; the 22 -> 41 gap exceeds the cap
    is_anchor, inserted = abca.enforce_zone_cap(jnp.asarray(mask), jnp.array([n]), cap)
    zones = abca.compute_zones(is_anchor, jnp.array([n]))
    paths = []
    for causal in (False, True):
        layer = abca.layer_intervals(zones, causal=causal, max_zone=cap).to_dense()[0, 0]
        hs = abca.chain_handshake(zones, causal=causal).to_dense()[0, 0]
        path = os.path.join(out_dir, f"abca_pattern_{'causal' if causal else 'bidirectional'}.png")
        viz.plot_mask(
            layer | hs,
            path,
            title=f"ABCA {'causal' if causal else 'bidirectional'}, n={n}, max_zone={cap}",
            extra={"anchors": int(zones.num_anchors[0]), "inserted": int(inserted[0])},
        )
        paths.append(path)
    return paths


@cli.entry_point
def main(argv=None):
    p = cli.ArgumentParser(__doc__)
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--handshake-steps", type=int, default=1)
    p.add_argument("--blocks-max-n", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out-dir", default="experiments/results")
    p.add_argument("--tag", default="bench_abca")
    p.add_argument("--figures", metavar="DIR", help="only draw the pattern PNGs into DIR (e.g. docs/img)")
    p.add_argument("--stages", action="store_true", help="only time the core's stages (anchors every 256)")
    p.add_argument("--compile", action="store_true", help="only time lowering + compiling the core's fwd+bwd")
    args = p.parse_args(argv)
    if args.compile:
        print(f"# load average {os.getloadavg()}")
        for n in args.n:
            for impl in (None, "xla"):
                t = measure_compile(n, impl)
                print(f"n={n} implementation={impl}: lower {t['lower_cpu_s']:.2f} CPU-s, compile "
                      f"{t['compile_cpu_s']:.2f} CPU-s", flush=True)  # fmt: skip
        print(f"# load average {os.getloadavg()}")
        return []
    if args.stages:
        print(f"# load average {os.getloadavg()}")
        for n in args.n:
            heads = 4 if n <= 4096 else 1
            for name, (f, fb) in measure_stages(n, heads, 256, args).items():
                print(f"n={n} H={heads} {name:15s} fwd {f:8.1f} CPU-ms  fwd+bwd {fb:8.1f} CPU-ms", flush=True)
        print(f"# load average {os.getloadavg()}")
        return []
    if args.figures:
        os.makedirs(args.figures, exist_ok=True)
        print("\n".join(draw_figures(args.figures)))
        return []
    os.makedirs(args.out_dir, exist_ok=True)
    command = benchlib.command_line("experiments.benchmarks.abca", argv)
    env = dict(benchlib.environment(), load_avg_at_start=os.getloadavg())
    print(f"# {command}\n# {env}")
    rows = run(args)
    base = os.path.join(args.out_dir, args.tag)
    config = dict(vars(args), load_avg_at_start=env["load_avg_at_start"], load_avg_at_end=os.getloadavg())
    print(benchlib.write_report(rows, base, command, config))
    print(f"wrote {base}.json, {base}.md")
    return rows


if __name__ == "__main__":
    main()
