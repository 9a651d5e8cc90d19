"""Seed-scale classification (`--config full`: 6 x 256, n up to 2048) on one GPU inside a fixed time budget.

    python -m experiments.gpu.classify --budget 570 --out "$OUT"          # a 10-minute device run
    python -m experiments.gpu.classify --budget 570 --dry_run             # the plan only

Cells run one at a time in PRIORITY order (seed 0 of n = 512, then 1024/2048, then seeds 1 and 2), each a
`python -m experiments.classification` subprocess with its own time limit (experiments/classification/grid.py). Before a
cell starts, its seconds are estimated (startup + compile + steps x a per-step guess for its n and mechanism,
scaled by how far the finished cells were off); a cell that does not fit the time left is skipped and the
next, cheaper ones are tried. Its subprocess limit is min(2 x estimate + 30 s, time left), so one slow cell
cannot eat the budget. Everything is written as it goes: `<out>/<task>.jsonl` (one line per finished cell,
as the CPU grid), `<out>/status.jsonl` (each cell's outcome, estimate and seconds), `<out>/plan.json`, and at
the end `<out>/results.md` + plots (the report, `experiments/reports/results.py`). Copy the JSONL lines into
experiments/results/ and rerun the report to put them into docs/results.md.

The per-step guesses are not measurements (no GPU run yet): `status.jsonl` records the real seconds.

Writes: result rows and the classification report under --out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from experiments.classification import grid as classify_grid
from experiments.classification.configs import CONFIGS
from experiments.classification.grid import Cell
from experiments.reports import results as report_results
from sparse_attn.studies import cli

MECHANISMS = ("dense", "local", "noncrossing_defect", "abca", "longformer", "labels")


def priority(seeds=(0, 1, 2)) -> list[Cell]:
    """Seed 0 first: ListOps and Dyck at 512, Pathfinder 32x32, then n = 2048; then the other seeds. Dyck also
    runs non-crossing routing with the router warm start (`classify_grid.WARM`)."""
    stages = [("listops", 512), ("dyck", 512), ("pathfinder", 1024), ("listops", 2048), ("dyck", 2048)]
    return [Cell(t, n, a, s) for s in seeds for t, n in stages
            for a in MECHANISMS + ((classify_grid.WARM,) if t == "dyck" else ())]


# Guessed ms per step of the full config (batch 32) on an H100/H200-class GPU for dense attention, and each
# mechanism's factor; replaced by measurement as cells finish (the scale factor in `run_budget`).
DENSE_STEP_MS = {128: 8.0, 256: 10.0, 512: 15.0, 1024: 30.0, 2048: 70.0, 4096: 250.0}
FACTOR = {"dense": 1.0, "local": 1.3, "longformer": 1.5, "bigbird": 2.0, "abca": 2.0, "abca_learned": 2.5,
          "labels": 4.0, "noncrossing_defect": 3.0, "noncrossing_brick": 2.0, "noncrossing_adjacent": 2.5}
STARTUP_S = 45.0  # interpreter + JAX start, train and eval compilation, validation set generation


def estimate_s(cell: Cell, steps: int) -> float:
    n = min(DENSE_STEP_MS, key=lambda k: abs(k - cell.n))
    ms = DENSE_STEP_MS[n] * (cell.n / n) ** 1.5 * max(FACTOR.get(a, 3.0) for a in cell.mechanism.split(","))
    return STARTUP_S + steps * ms / 1e3


def plan(cells: list[Cell], steps: int, budget_s: float, estimate=estimate_s) -> list[dict]:
    """Greedy in priority order: a cell is planned if its estimate fits what the planned ones leave."""
    out, used = [], 0.0
    for cell in cells:
        est = estimate(cell, steps)
        fits = used + est <= budget_s
        used += est if fits else 0.0
        out.append({"cell": cell._asdict(), "estimate_s": round(est, 1), "planned": fits,
                    "planned_end_s": round(used, 1) if fits else None})
    return out


def run_subprocess(argv: list[str], timeout_s: float, grace_s: float = 20.0) -> int:
    """`python -m experiments.classification argv` with a short grace after SIGTERM (the budget is tight)."""
    proc = subprocess.Popen([sys.executable, "-m", "experiments.classification", *argv])
    try:
        return proc.wait(timeout=max(timeout_s, 0.1))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 124


def _append(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def run_budget(cells: list[Cell], *, config: str, steps: int, budget_s: float, out: str, runs_dir: str,
               reserve_s: float = 30.0, estimate=estimate_s, run=run_subprocess, clock=time.monotonic,
               log=print) -> list[dict]:
    """Run the cells that fit `budget_s - reserve_s` (the reserve is for the report); returns status records."""
    os.makedirs(out, exist_ok=True)
    start = clock()
    end = start + budget_s - reserve_s
    scale = 1.0  # measured / estimated seconds of the finished cells
    records = []
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump({"budget_s": budget_s, "reserve_s": reserve_s, "config": config, "steps": steps,
                   "plan": plan(cells, steps, budget_s - reserve_s, estimate)}, f, indent=1)
    for cell in cells:
        left = end - clock()
        est = scale * estimate(cell, steps)
        record = {"cell": cell._asdict(), "estimate_s": round(est, 1), "left_s": round(left, 1)}
        if est > left:
            record["status"] = "skipped (does not fit)"
        else:
            limit = min(2 * est + 30.0, left)
            t0 = clock()
            status = classify_grid.run_grid(
                [cell], config=config, num_steps=steps, results_dir=out, runs_dir=runs_dir, time_limit_s=limit,
                run=run, log=log, grid="gpu_classify",
                grid_command="python -m experiments.gpu.classify " + " ".join(sys.argv[1:]))[cell]
            took = clock() - t0
            record.update(status=status, limit_s=round(limit, 1), seconds=round(took, 1))
            if status == "finished":
                scale = min(4.0, max(0.25, took / estimate(cell, steps)))
        records.append(record)
        _append(os.path.join(out, "status.jsonl"), record)
        log(f"{record['status']:28s} {cell} est {est:.0f} s, left {left:.0f} s")
    return records


@cli.entry_point
def main(argv=None) -> list[dict]:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--budget", type=float, default=570, help="seconds for everything, report included")
    parser.add_argument("--reserve", type=float, default=30, help="seconds kept for the report")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="full")
    parser.add_argument("--num_steps", type=int, default=1000,
                        help="steps per cell (the full config's 10k do not fit a 10-minute run)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join("experiments", "results", "gpu"))
    parser.add_argument("--runs_dir", default=os.path.join("/tmp", "gpu_classify_runs"))
    parser.add_argument("--dry_run", action="store_true", help="print the plan only")
    args = parser.parse_args(argv)
    cells = priority(tuple(int(s) for s in args.seeds.split(",")))
    if args.dry_run:
        entries = plan(cells, args.num_steps, args.budget - args.reserve)
        for e in entries:
            print(("planned " if e["planned"] else "no room ") + f"{e['estimate_s']:7.1f} s  {Cell(**e['cell'])}")
        return entries
    records = run_budget(cells, config=args.config, steps=args.num_steps, budget_s=args.budget, out=args.out,
                         runs_dir=args.runs_dir, reserve_s=args.reserve)
    report_results.render(args.out, os.path.join(args.out, "results.md"), plots_dir=args.out,
                          note=f"GPU run of `python -m experiments.gpu.classify {' '.join(argv or sys.argv[1:])}`.")
    return records


if __name__ == "__main__":
    main()
