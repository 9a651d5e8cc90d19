"""The seeds' LM scale on one GPU in about 10 minutes: a GPT-2-small-shaped byte LM (12 x 768, 12 heads, MLP 3072;
~85M parameters, "125M-class" with a byte vocabulary) at contexts 4k-16k, dense vs equal-budget sparse attention.

    python -m experiments.gpu.lm                    # the plan below within --total_s (default 540 s)
    python -m experiments.gpu.lm --dry_run          # print the plan (budget matching on the CPU), train nothing
    python -m experiments.gpu.lm --tiny             # the same code path at CPU size (n = 64, 1 x 32, 4 steps)

Each cell runs `python -m experiments.gpu.lm --cell ...` in a subprocess with a time limit of
min(--cell_s, what is left of --total_s); a finished cell appends its `experiments/lm/grid.py` row to --results
(default experiments/results/lm_gpu.jsonl) at once, a cell cut by its limit (SIGTERM: the loop saves its step) or
failing (e.g. out of memory) appends a row of kind "lm_partial" with its status, the steps it reached and its last
train bits/byte. Cells with a full row are skipped, so running the command again continues the plan (a cut cell
resumes from its checkpoint). XLA's compilation cache lives in runs/jax_cache so a rerun compiles less.

Budgets (keys per query; dense causal has (n + 1) / 2): 128 for local, Longformer, labels and fixed-interval ABCA
(16x fewer than dense at 4k, 64x at 16k); explicit newline ABCA cannot reach 128 (lines are short: it gets ~25),
so it runs at its own budget 24 beside local at 24. Order = priority: 4k first, then 16k, then 8k.

Writes: one workdir per cell and one JSON line per cell (finished, cut or refused) under --out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time

from experiments.lm import grid as lm_grid
from sparse_attn.data import StdlibSource
from sparse_attn.studies import cli
from sparse_attn.studies.budget import attention_for_budget, keys_per_query, newline_windows, recorded_fields
from sparse_attn.studies.cells import read_rows, row_key
from sparse_attn.studies.runs import git_commit
from sparse_attn.train import read_metrics

RESULTS = os.path.join("experiments", "results", "lm_gpu.jsonl")
TOKENS_PER_STEP = 32_768


def full_scale(n: int, steps: int) -> lm_grid.Scale:
    """12 x 768 at ~32k tokens per step (batch = 32768 / n, at least 1), one evaluation and checkpoint at the end."""
    return lm_grid.Scale(layers=12, dim=768, heads=12, mlp=3072, batch=max(TOKENS_PER_STEP // n, 1), steps=steps,
                         lr=6e-4, warmup=max(steps // 10, 1), eval_every=steps, eval_batches=4,
                         checkpoint_every=steps)


def tiny_scale(n: int, steps: int) -> lm_grid.Scale:
    return dataclasses.replace(lm_grid.SCALES["smoke"], steps=steps, eval_every=steps, checkpoint_every=steps)


def _group(ns, mechanisms, budget):
    return [lm_grid.Cell(n, v, budget, 0) for n in ns for v in mechanisms]


PLAN = [
    *_group((4096,), ("dense", "local", "labels_d8k2", "abca_fixed"), 128),
    *_group((4096,), ("moba", "nsa"), 128),  # the trainable sparse baselines beside them
    *_group((4096,), ("abca", "local"), 24),
    *_group((16384,), ("dense", "local", "labels_d8k2", "abca_fixed"), 128),
    *_group((4096,), ("longformer",), 128),
    *_group((8192,), ("dense", "local", "labels_d8k2", "abca_fixed"), 128),
]
TINY_PLAN = [lm_grid.Cell(64, "dense", 12, 0), lm_grid.Cell(64, "local", 12, 0)]


def describe(cell: lm_grid.Cell, tokens_U8) -> dict:
    """The matched config of a cell and its planned keys per query (CPU only: no training)."""
    tokens = newline_windows(tokens_U8, cell.n, num=4)
    att = attention_for_budget(cell.mechanism, n=cell.n, keys_per_query_target=cell.budget, tokens_BxN=tokens)
    tuned = recorded_fields(att)
    return {"n": cell.n, "mechanism": cell.mechanism, "budget": cell.budget, "type": type(att).__name__, **tuned,
            "planned_keys_per_query": round(keys_per_query(att, cell.n, tokens), 2), "dense_keys": (cell.n + 1) / 2}


def _config_name(tiny: bool) -> str:
    return "gpu_tiny" if tiny else "gpu_full"


def partial_row(cell: lm_grid.Cell, config: str, workdir: str, status: str, command: str) -> dict:
    """What a cut or failed cell reached (from its metrics.jsonl, if any)."""
    train = {}
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        train = read_metrics(workdir, "train")
    last = [r["bits_per_byte"] for r in list(train.values())[-10:] if "bits_per_byte" in r]
    return {"kind": "lm_partial", "config": config, "n": cell.n, "mechanism": cell.mechanism,
            "budget_keys_per_query": cell.budget, "seed": cell.seed, "status": status,
            "steps_reached": max(train, default=0),
            "train_bits_per_byte_last10": sum(last) / len(last) if last else None,
            "command": command, "commit": git_commit(), "workdir": workdir}


def run_plan(plan, *, tiny: bool, steps: int, total_s: float, cell_s: float, results: str, runs_dir: str,
             min_cell_s: float = 30.0, run_cmd=lm_grid.run_subprocess, clock=time.monotonic, log=print) -> dict:
    """Run the cells without a full row in order, each limited to min(cell_s, time left); no cell starts with
    less than `min_cell_s` left (it could not compile, train and save in less). Returns their status."""
    config = _config_name(tiny)
    t_end = clock() + total_s
    status = {}
    for cell in plan:
        done = {row_key(r) for r in read_rows(results) if r.get("kind") == "lm"}
        if (config, *cell) in done:
            status[cell] = "done before"
            continue
        left = t_end - clock()
        if left < min_cell_s:
            status[cell] = "not run (out of time: run again to continue)"
            continue
        workdir = lm_grid.cell_workdir(runs_dir, config, cell)
        argv = ["--cell", str(cell.n), cell.mechanism, f"{cell.budget:g}", str(cell.seed), "--steps", str(steps),
                "--results", results, "--workdir", workdir] + (["--tiny"] if tiny else [])
        log(f"== {cell}: limit {min(cell_s, left):.0f} s")
        t0 = clock()
        rc = run_cmd(argv, min(cell_s, left), module="experiments.gpu.lm")
        status[cell] = {0: "finished", 124: "timed out"}.get(rc, f"failed (exit {rc})")
        if rc != 0:
            row = partial_row(cell, config, workdir, status[cell], "python -m experiments.gpu.lm " + shlex.join(argv))
            os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
        log(f"   {status[cell]} in {clock() - t0:.0f} s")
    return status


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--tiny", action="store_true", help="CPU-sized model and plan (tests the pipeline)")
    parser.add_argument("--dry_run", action="store_true", help="print the plan and the matched configs only")
    parser.add_argument("--steps", type=int, help="training steps per cell (default 150; --tiny 4)")
    parser.add_argument("--total_s", type=float, help="wall-clock limit of the whole plan (default 540 s; --tiny 1800)")
    parser.add_argument("--cell_s", type=float, help="wall-clock limit per cell (default 150 s; --tiny 900)")
    parser.add_argument("--min_cell_s", type=float, default=30.0, help="start no cell with less time left")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--runs_dir", default=os.path.join("runs", "gpu_lm"))
    parser.add_argument("--cell", nargs=4, metavar=("N", "VARIANT", "BUDGET", "SEED"), help="run one cell (internal)")
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.tiny else 150)
    plan = TINY_PLAN if args.tiny else PLAN
    if args.cell:
        cell = lm_grid.Cell(int(args.cell[0]), args.cell[1], float(args.cell[2]), int(args.cell[3]))
        scale = (tiny_scale if args.tiny else full_scale)(cell.n, steps)
        command = "python -m experiments.gpu.lm " + shlex.join(argv if argv is not None else sys.argv[1:])
        return lm_grid.run_cell(_config_name(args.tiny), cell, workdir=args.workdir, results=args.results,
                                command=command, scale=scale)
    if args.dry_run:
        corpus = StdlibSource().load()
        rows = [describe(cell, corpus.train_U8) for cell in plan]
        for row in rows:
            print(json.dumps(row))
        return {"plan": rows}
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.abspath(os.path.join("runs", "jax_cache")))
    total_s = args.total_s or (1800.0 if args.tiny else 540.0)
    cell_s = args.cell_s or (900.0 if args.tiny else 150.0)
    status = run_plan(plan, tiny=args.tiny, steps=steps, total_s=total_s, cell_s=cell_s,
                      results=args.results, runs_dir=args.runs_dir, min_cell_s=args.min_cell_s)
    for cell, s in status.items():
        print(f"{s:45s} {cell}")
    return {"status": status}


if __name__ == "__main__":
    main()
