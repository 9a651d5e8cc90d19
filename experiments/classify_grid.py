"""Run a grid of classification cells (task, n, attention, seed) one after another, each with a time limit.

    .venv/bin/python -m experiments.classify_grid --grid seed002 --config seed --time_limit 7200

Each cell is `python -m experiments.classify ... --results experiments/results/<task>.jsonl` in a subprocess
(workdir `runs/grid/<config>/<task>_n<n>_<attention>_s<seed>`), so a finished cell appends one JSON line. A
cell whose row is already in the results file is skipped; a cell past its limit gets SIGTERM (the loop saves
its step and exits), leaves no row, and resumes from its checkpoint when the grid is run again. Render the
tables and plots with `python -m experiments.report_results`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

from experiments.classify import CONFIGS


class Cell(NamedTuple):
    task: str
    n: int
    attention: str
    seed: int


def _cells(tasks_n: dict[str, tuple[int, ...]], attentions: tuple[str, ...], seeds: tuple[int, ...]) -> list[Cell]:
    return [Cell(t, n, a, s) for t, ns in tasks_n.items() for n in ns for a in attentions for s in seeds]


# Seed 002: dense vs local vs non-crossing routing on the hierarchical tasks at 128/512/2048, Pathfinder 32x32 as
# the offline non-hierarchical control (CIFAR-10 needs its TFDS data: add ("cifar10", (1024,)) where prepared).
SEED002_TASKS = {"listops": (128, 512, 2048), "dyck": (128, 512, 2048), "pathfinder": (1024,)}
SEEDS = (0, 1, 2)
GRIDS = {
    "seed002": _cells(SEED002_TASKS, ("dense", "local", "noncrossing_defect"), SEEDS),  # 63 cells
    # The other baselines and mechanisms on the same cells.
    "seed002_more": _cells(SEED002_TASKS, ("longformer", "bigbird", "abca", "abca_learned", "labels",
                                           "noncrossing_brick", "noncrossing_adjacent"), SEEDS),
    # Only the middle block pair replaced, as the seed's "replace one or two dense blocks" (6 layers).
    "seed002_hybrid": _cells({"listops": (512, 2048), "dyck": (512, 2048)},
                             ("dense,dense,noncrossing_defect,noncrossing_defect,dense,dense",), SEEDS),
    "sample": _cells({"digits": (64,)}, ("dense", "local"), (0,)),
}


def _key(row: dict) -> tuple:
    return row.get("task"), row.get("n"), row.get("attention"), row.get("seed"), row.get("config"), row.get("steps")


def finished_keys(path: str) -> set[tuple]:
    """Cells with a result line in `path` (unreadable lines are ignored)."""
    keys = set()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    keys.add(_key(json.loads(line)))
                except json.JSONDecodeError:
                    continue
    return keys


def run_subprocess(argv: list[str], timeout_s: float) -> int:
    """`python -m experiments.classify argv`; past `timeout_s` SIGTERM (the loop saves and exits 143), then
    SIGKILL after 120 s more. Returns the exit status, 124 on a timeout."""
    proc = subprocess.Popen([sys.executable, "-m", "experiments.classify", *argv])
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 124


def run_grid(cells: list[Cell], *, config: str, num_steps: int | None, results_dir: str, runs_dir: str,
             time_limit_s: float, run=run_subprocess, log=print) -> dict[Cell, str]:
    """Run the cells without a result line, in order; returns each cell's status."""
    steps = num_steps if num_steps is not None else CONFIGS[config]().train.num_steps
    status = {}
    for cell in cells:
        results = os.path.join(results_dir, f"{cell.task}.jsonl")
        if (cell.task, cell.n, cell.attention, cell.seed, config, steps) in finished_keys(results):
            status[cell] = "done before"
            continue
        workdir = os.path.join(runs_dir, config, f"{cell.task}_n{cell.n}_{cell.attention.replace(',', '+')}"
                                                 f"_s{cell.seed}")
        argv = ["--task", cell.task, "--n", str(cell.n), "--attention", cell.attention, "--config", config,
                "--seed", str(cell.seed), "--workdir", workdir, "--results", results]
        if num_steps is not None:
            argv += ["--num_steps", str(num_steps)]
        log(f"== {cell} -> {workdir}")
        t0 = time.perf_counter()
        rc = run(argv, time_limit_s)
        if rc == 124:
            status[cell] = "timed out (rerun to resume)"
        elif rc != 0:
            status[cell] = f"failed (exit {rc})"
        else:
            status[cell] = "finished"
        log(f"   {status[cell]} in {time.perf_counter() - t0:.0f} s")
    return status


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="seed")
    parser.add_argument("--num_steps", type=int)
    parser.add_argument("--time_limit", type=float, default=7200, help="seconds per cell")
    parser.add_argument("--results_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--runs_dir", default=os.path.join("runs", "grid"))
    parser.add_argument("--dry_run", action="store_true", help="list the cells and their status only")
    args = parser.parse_args(argv)
    cells = GRIDS[args.grid]
    if args.dry_run:
        for cell in cells:
            print(cell)
        return {}
    status = run_grid(cells, config=args.config, num_steps=args.num_steps, results_dir=args.results_dir,
                      runs_dir=args.runs_dir, time_limit_s=args.time_limit)
    for cell, s in status.items():
        print(f"{s:30s} {cell}")
    return status


if __name__ == "__main__":
    main()
