"""Benchmark helpers: wall time (median after warm-up, blocked until ready), compiled peak memory, tables, plots.

Every mechanism's benchmark script reuses these, so all speed and memory numbers are measured the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention
from sparse_attn.registry import BenchCore


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """One cell of a benchmark: a mechanism's benchmark core (`sparse_attn.registry.Mechanism.bench`) maps it to a
    `sparse_attn.registry.BenchCore`. `radius`: the window a windowed pattern or router takes; `causal`: the causal
    form where the mechanism has one; `impl`: the executor of the mechanism's pattern (None: the platform default)."""

    n: int
    batch: int
    heads: int
    head_dim: int
    dtype: str
    radius: int
    impl: str | None
    key: jax.Array
    causal: bool = False


def qkv(spec: BenchSpec) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random q, k, v [B, N, H, D] of the spec's dtype."""
    shape = (spec.batch, spec.n, spec.heads, spec.head_dim)
    return tuple(jax.random.normal(k, shape, jnp.dtype(spec.dtype)) for k in jax.random.split(spec.key, 3))


def with_pattern(build: Callable[[BenchSpec], object]) -> Callable[[BenchSpec], BenchCore]:
    """A benchmark core that runs `sparse_attn.attention` on the pattern `build(spec)` with the spec's executor."""

    def core(spec: BenchSpec) -> BenchCore:
        pattern = build(spec)
        fn = lambda q, k, v: (attention(q, k, v, pattern, implementation=spec.impl), None)  # noqa: E731
        return BenchCore(fn, qkv(spec), pattern)

    return core


def time_fn(fn: Callable, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time in seconds of `fn(*args)` (jitted by the caller), blocked until ready."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compiled_memory(jitted: Callable, *args) -> int:
    """XLA's compiled memory analysis: temp + arguments + outputs, in bytes."""
    mem = jitted.lower(*args).compile().memory_analysis()
    return int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)


def fwd_bwd(fn: Callable, argnums: tuple[int, ...]) -> Callable:
    """Forward + backward of `sum(fn(*args) * ct)` w.r.t. the args at `argnums` (called as `(*args, ct)`)."""

    def loss(*args):
        *args, ct = args
        return jnp.sum(fn(*args).astype(jnp.float32) * ct)

    return jax.grad(loss, argnums=argnums)


@dataclasses.dataclass
class Row:
    mechanism: str
    impl: str
    n: int
    fwd_s: float
    fwd_bwd_s: float
    mem_bytes: int
    flops: float | None = None
    speedup_fwd: float | None = None
    speedup_fwd_bwd: float | None = None
    mem_ratio: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)


def measure(mechanism: str, impl: str, n: int, fn: Callable, args: tuple, *, repeats: int = 5, flops=None, extra=None,
            grad_argnums: tuple[int, ...] | None = None):
    """Times fn forward and forward+backward (w.r.t. the args at `grad_argnums`, default all) and reads its compiled
    memory (forward+backward)."""
    fwd = jax.jit(fn)
    out = jax.eval_shape(fn, *args)
    ct = jnp.ones(out.shape, jnp.float32)
    fb = jax.jit(fwd_bwd(fn, tuple(range(len(args))) if grad_argnums is None else grad_argnums))
    return Row(
        mechanism=mechanism,
        impl=impl,
        n=n,
        fwd_s=time_fn(fwd, *args, repeats=repeats),
        fwd_bwd_s=time_fn(fb, *args, ct, repeats=repeats),
        mem_bytes=compiled_memory(fb, *args, ct),
        flops=flops,
        extra=extra or {},
    )


def print_row(row: Row, width: int = 14, extra: bool = False) -> None:
    """One progress line of a measured row (its extra dict too with `extra`)."""
    line = (f"  n={row.n} {row.mechanism:{width}s} {row.impl:8s} fwd {row.fwd_s * 1e3:9.2f} ms  "
            f"fwd+bwd {row.fwd_bwd_s * 1e3:9.2f} ms  mem {row.mem_bytes / 2**20:8.1f} MiB")  # fmt: skip
    print(line + (f"  {row.extra}" if extra else ""), flush=True)


def add_ratios(rows: list[Row], baseline: str = "dense") -> list[Row]:
    """Speedups and memory ratios against the baseline row of the same n (measured in the same run)."""
    base = {r.n: r for r in rows if r.mechanism == baseline}
    for r in rows:
        b = base.get(r.n)
        if b is not None:
            r.speedup_fwd = b.fwd_s / r.fwd_s
            r.speedup_fwd_bwd = b.fwd_bwd_s / r.fwd_bwd_s
            r.mem_ratio = b.mem_bytes / r.mem_bytes
    return rows


def format_table(rows: list[Row]) -> str:
    head = "| mechanism | impl | n | fwd ms | fwd+bwd ms | peak MiB | GFLOP | speedup fwd | speedup fwd+bwd | mem ratio |"
    lines = [head, "|" + "---|" * 10]
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r.mechanism} | {r.impl} | {r.n} | {r.fwd_s * 1e3:.2f} | {r.fwd_bwd_s * 1e3:.2f} | "
            f"{r.mem_bytes / 2**20:.1f} | {fmt(None if r.flops is None else r.flops / 1e9, '.2f')} | "
            f"{fmt(r.speedup_fwd, '.2f')}x | {fmt(r.speedup_fwd_bwd, '.2f')}x | {fmt(r.mem_ratio, '.2f')}x |"
        )
    return "\n".join(lines)


def command_line(module: str, argv=None) -> str:
    """The command that reproduces this run: `python -m <module> <its arguments>` (argv None: the process's own)."""
    return " ".join(["python -m", module, *(argv if argv is not None else sys.argv[1:])])


def announce(module: str, argv, out_dir: str) -> str:
    """Creates `out_dir` and prints the command and the environment every table carries; returns the command."""
    os.makedirs(out_dir, exist_ok=True)
    command = command_line(module, argv)
    print(f"# {command}\n# {environment()}", flush=True)
    return command


def environment() -> dict:
    return dict(
        jax=jax.__version__,
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
        machine=platform.machine(),
        python=platform.python_version(),
    )


def write_json(rows: list[Row], path: str, command: str, config: dict | None = None) -> None:
    with open(path, "w") as f:
        json.dump(
            dict(command=command, environment=environment(), config=config or {}, rows=[dataclasses.asdict(r) for r in rows]),
            f,
            indent=2,
        )


def write_report(rows: list[Row], base: str, command: str, config: dict | None = None, notes: str = "") -> str:
    """Writes `<base>.json` and `<base>.md` (command, environment, table, notes); returns the table."""
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    table = format_table(rows)
    write_json(rows, base + ".json", command, config)
    with open(base + ".md", "w") as f:
        f.write(f"Command: `{command}`\n\nEnvironment: {environment()}\n\n{table}\n")
        if notes:
            f.write(f"\n{notes}\n")
    return table


def plot_rows(rows: list[Row], path: str, title: str = "") -> None:
    """Log-log plot of forward+backward time and compiled memory versus n, one line per mechanism/impl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for key in sorted({(r.mechanism, r.impl) for r in rows}):
        sel = sorted((r for r in rows if (r.mechanism, r.impl) == key), key=lambda r: r.n)
        ns = [r.n for r in sel]
        ax_t.plot(ns, [r.fwd_bwd_s * 1e3 for r in sel], marker="o", label=f"{key[0]} ({key[1]})")
        ax_m.plot(ns, [r.mem_bytes / 2**20 for r in sel], marker="o", label=f"{key[0]} ({key[1]})")
    for ax, name in ((ax_t, "forward+backward time (ms)"), (ax_m, "compiled peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def add_timing_args(parser, *, repeats: int = 5, out_dir: str | None = "experiments/results", tag: str | None = None,
                    batch: int | None = None, heads: int | None = None) -> None:
    """The flags every benchmark script shares: `--repeats` (timed calls, median), `--out-dir` and `--tag` (where the
    table and rows go), and the batch and head counts where given."""
    if batch is not None:
        parser.add_argument("--batch", type=int, default=batch)
    if heads is not None:
        parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--repeats", type=int, default=repeats, help="timed calls per measurement (median)")
    if out_dir is not None:
        parser.add_argument("--out-dir", default=out_dir, help="where the table (.md) and rows (.json) go")
    if tag is not None:
        parser.add_argument("--tag", default=tag, help="file name of the table and rows")
