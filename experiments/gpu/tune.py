"""Tile sweep of the dense-class kernel on one GPU: which Triton tiles, warps and pipeline stages
per head dim, timed side by side with cuDNN dense in one run.

Command (one H200, nothing installed; a 200 s budget by default, after or instead of experiments/gpu/check.py):
    SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 300 python3 -m experiments.gpu.tune --out $OUT
        -> appends to OUT/gpu_tune.jsonl, rewrites OUT/gpu_tune.md (then copy both into experiments/results/)
    python -m experiments.gpu.tune --dry-run --out /tmp/x   # CPU, interpret mode, tiny sizes: every code path

Per head dim (64, then 128) and mode (fwd, fwd+bwd): cuDNN dense first, then `pallas_attention` on the dense
pattern with each candidate `BlockSizes` (the current default first; only candidates whose every launch fits the
H100/H200 shared memory by `kernels.smem.fits`), n = 16384, B = 1, H = 16, bf16. Rows as gpu_check's (method
`cudnn_dense` or `tune_dense`, plus `blocks`), appended as measured; a spent budget records `skipped` rows. The
markdown names the fastest candidate per (d, mode) and its ratio to cuDNN: what `BlockSizes.default` should become.

Writes: DIR/gpu_tune.jsonl and DIR/gpu_tune.md (--out DIR).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
import traceback

import jax
import jax.numpy as jnp

import sparse_attn.kernels as kernels
from experiments.gpu import check as gpu_check
from experiments.gpu import measure
from experiments.gpu import methods as check_methods
from sparse_attn.kernels import smem
from sparse_attn.patterns import baselines
from sparse_attn.studies import cli
from sparse_attn.studies.runs import git_commit

B = kernels.BlockSizes
# (fwd tiles, bwd tiles, warps, stages): FlexAttention's and FlashAttention-2's Hopper choices and their neighbours.
TRITON_CANDIDATES = {
    64: (B(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3),
         B(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=8, num_stages=3),
         B(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=4),
         B(block_q=64, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3),
         B(block_q=128, block_k=128, block_q_bwd=128, block_k_bwd=64, num_warps=8, num_stages=2),
         B(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=128, num_warps=8, num_stages=2),
         B(block_q=128, block_k=128, block_q_bwd=128, block_k_bwd=128, num_warps=8, num_stages=2)),
    128: (B(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=8, num_stages=2),
          B(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=2),
          B(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=8, num_stages=2),
          B(block_q=64, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3),
          B(block_q=128, block_k=32, block_q_bwd=64, block_k_bwd=32, num_warps=4, num_stages=3)),
}
DRY_CANDIDATES = {32: (B(block_q=32, block_k=32), B(block_q=16, block_k=32, num_warps=4, num_stages=3))}


def candidates(head_dim: int, dry_run: bool = False) -> list[kernels.BlockSizes]:
    """The sweep at `head_dim`: the bf16 default first, then every listed candidate that fits shared memory."""
    if dry_run:
        return list(DRY_CANDIDATES[head_dim])
    listed = [B.default("triton", head_dim), *TRITON_CANDIDATES[head_dim]]
    return [b for b in dict.fromkeys(listed) if smem.fits(b, head_dim, 2)]


def sweep(p: check_methods.Plan, head_dims, emit, t_start: float, dry_run: bool) -> None:
    for d in head_dims:
        n = p.n
        pairs = n * n
        ks = jax.random.split(jax.random.key(d), 3)
        qkv = [jax.random.normal(x, (1, n, p.heads, d), jnp.float32).astype(jnp.bfloat16) for x in ks]
        pattern = baselines.dense(n)
        methods = [("cudnn_dense", None, check_methods.cudnn_method(p, False, pairs))]
        for blocks in candidates(d, dry_run):
            cfg = kernels.KernelConfig(block_sizes=blocks, interpret=True if p.interpret else None)
            methods.append(("tune_dense", blocks, check_methods.kernel_method(dataclasses.replace(p, config=cfg),
                                                                          pattern, d, pairs)))
        for mode in ("fwd", "fwd+bwd"):
            for name, blocks, method in methods:
                row = dict(method=name, n=n, d=d, mode=mode, dtype="bfloat16")
                if blocks is not None:
                    row["blocks"] = dataclasses.asdict(blocks)
                left = p.budget_s - (time.perf_counter() - t_start)
                if left <= 0:
                    emit(dict(row, skipped="time budget"))
                    continue
                try:
                    res = measure.time_row(method, mode, qkv, p, min(p.compile_limit_s, left))
                    flops = 4.0 * d * pairs * p.heads * (1.0 if mode == "fwd" else 3.5)
                    emit(dict(row, ms=res["ms"], tflops=flops / (res["ms"] * 1e-3) / 1e12, pairs=pairs,
                              first_call_s=res["first_call_s"]))
                except Exception as e:  # noqa: BLE001  (a failure is a result)
                    emit(dict(row, error=f"{type(e).__name__}: {str(e)[:400]}"))


def _blocks_label(b: dict) -> str:
    return (f"fwd {b['block_q']}x{b['block_k']}, bwd {b['block_q_bwd'] or b['block_q']}x"
            f"{b['block_k_bwd'] or b['block_k']}, warps {b['num_warps'] or 'auto'}, stages {b['num_stages']}")


def markdown(rows: list[dict], common: dict, p: check_methods.Plan | None = None) -> str:
    lines = [f"# Dense kernel tile sweep: {common['device']}, jax {common['jax']}, commit {common['commit']}, "
             f"{common['date']}", "",
             "Command: `SPARSE_ATTN_COMMIT=<hash> PYTHONPATH=. timeout 300 python3 -m experiments.gpu.tune` "
             "(B=1, H=16, bf16, dense pattern; rows in gpu_tune.jsonl). vs cuDNN: cuDNN ms / ms (> 1: faster). "
             "The first candidate of each table is the current default.", ""]
    for d, mode in dict.fromkeys((r["d"], r["mode"]) for r in rows):
        group = [r for r in rows if (r["d"], r["mode"]) == (d, mode)]
        base = next((r for r in group if r["method"] == "cudnn_dense" and "ms" in r), None)
        timed = [r for r in group if r["method"] == "tune_dense" and "ms" in r]
        best = min(timed, key=lambda r: r["ms"]) if timed else None
        lines += [f"## d = {d}, {mode} (n = {group[0]['n']})", ""]
        if best is not None:
            ratio = f", {base['ms'] / best['ms']:.2f}x cuDNN" if base else ""
            lines += [f"Fastest: {_blocks_label(best['blocks'])} ({best['ms']:.3f} ms{ratio}).", ""]
        lines += ["| method | tiles | ms | TFLOP/s | vs cuDNN | first call s |", "|---|---|---|---|---|---|"]
        for r in group:
            tiles = _blocks_label(r["blocks"]) if "blocks" in r else "-"
            if "ms" not in r:
                lines.append(f"| {r['method']} | {tiles} | {r.get('skipped') or r.get('error', '')[:80]} | | | |")
                continue
            vs = f"{base['ms'] / r['ms']:.2f}x" if base else "-"
            lines.append(f"| {r['method']} | {tiles} | {r['ms']:.3f} | {r['tflops']:.1f} | {vs} | "
                         f"{r['first_call_s']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


@cli.entry_point
def main(argv=None) -> list[dict]:
    t_start = time.perf_counter()
    ap = cli.ArgumentParser(__doc__)
    measure.add_run_args(ap, out=None, budget_s=200, compile_limit_s=30)
    args = ap.parse_args(argv)
    measure.require_gpu(args.dry_run)
    p = dataclasses.replace(check_methods.plan(args.dry_run, args.budget_s), compile_limit_s=args.compile_limit_s)
    head_dims = (32,) if args.dry_run else (64, 128)
    dev = jax.devices()[0]
    common = dict(commit=git_commit(), device=dev.device_kind, jax=jax.__version__,
                  date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    rec = gpu_check.Recorder(args.out, common, p, name="gpu_tune", render=markdown)
    log = lambda msg: print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)  # noqa: E731
    emit = lambda row: rec.emit(row, log)  # noqa: E731

    try:
        sweep(p, head_dims, emit, t_start, args.dry_run)
    except Exception:  # noqa: BLE001  (rows so far are on disk; say what broke)
        log(traceback.format_exc()[-2000:])
    return rec.rows


if __name__ == "__main__":
    main()
    if any(t.is_alive() for t in measure._ABANDONED):  # rows are on disk: don't wait for an abandoned compile
        os._exit(0)
