"""Run a grid of classification cells (task, n, mechanism, seed) one after another, each with a time limit.

    .venv/bin/python -m experiments.classification.grid --grid noncrossing --config full --time_limit 7200

Each cell is `python -m experiments.classification ... --results experiments/results/<task>.jsonl` in a subprocess
(workdir `runs/grid/<config>/<task>_n<n>_<mechanism>_s<seed>`), so a finished cell appends one JSON line. A
cell whose row is already in the results file is skipped; a cell past its limit gets SIGTERM (the loop saves
its step and exits), leaves no row, and resumes from its checkpoint when the grid is run again. Render the
tables and plots with `python -m experiments.reports.results`.

Writes: one workdir per cell under --runs_dir and one JSON line per finished cell in --results_dir/<task>.jsonl.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sys
import threading
import time
from typing import NamedTuple

from experiments.classification.configs import CONFIGS
from sparse_attn.studies import cli
from sparse_attn.studies.runs import git_commit, run_module


class Cell(NamedTuple):
    task: str
    n: int
    mechanism: str
    seed: int
    steps: int | None = None  # None: the config's (or --num_steps)


def _cells(tasks_n: dict[str, tuple[int, ...]], mechanisms: tuple[str, ...], seeds: tuple[int, ...]) -> list[Cell]:
    return [Cell(t, n, a, s) for t, ns in tasks_n.items() for n in ns for a in mechanisms for s in seeds]


# The non-crossing research document's study: dense vs local vs non-crossing routing on the hierarchical tasks at
# 128/512/2048, Pathfinder 32x32 as
# the offline non-hierarchical control (CIFAR-10 needs its TFDS data: add ("cifar10", (1024,)) where prepared).
DOCUMENT_TASKS = {"listops": (128, 512, 2048), "dyck": (128, 512, 2048), "pathfinder": (1024,)}
SEEDS = (0, 1, 2)

# The CPU grid (`--config cpu`, docs/results.md): the three task families at n = 128 and 512 (Pathfinder
# 11x11 / 22x22 padded), the baselines and each mechanism family. 600 steps at n = 128: dense ListOps is at the
# majority class (0.13-0.15) through step 150 and at 0.34 by step 600 (0.14-0.19 s a step at load 3-13); 120
# steps (the grid's first budget) was chance for every cell. 300 at n = 512: dense takes ~2 s a step there at
# load 13, so 600 steps (~20 min a cell) did not fit; the n = 128 curves give the same-budget step-300 numbers.
CPU_TASKS = ("listops", "dyck", "pathfinder")
CPU_ATTENTION = ("dense", "local", "longformer", "abca", "noncrossing_defect", "labels")
CPU_STEPS = {128: 600, 512: 300}
CPU_MECHANISMS = ("longformer", "abca", "noncrossing_defect")  # all but labels (~9x dense's time a step)
WARM = "noncrossing_defect+warm200"  # Dyck only: layer 0's router pre-fitted to the brackets (supervision)


def cpu_cells(steps: dict[int, int] = CPU_STEPS) -> list[Cell]:
    """Every (task, n, mechanism, seed) once, in the order a ~75-minute run on 2 shared cores should take them:
    ListOps n = 128 seed 0; Dyck/Pathfinder dense and local; ListOps n = 512 dense, local and non-crossing
    routing (at n = 128 two layers of local's 32-key radius already reach the whole sequence, so only
    n = 512 restricts local); ListOps seeds 1-2 of those three; the other mechanisms on Pathfinder (where
    dense learned something by step 600) and Dyck (where neither dense nor local did); ListOps seeds 1-2 of the
    other mechanisms; labels; non-crossing routing on Dyck with the router warm start (the one arm that learned
    Dyck in docs/noncrossing.md's study); Pathfinder seeds 1-2 (the one task where dense has learned something at
    n = 128,
    so the one where seeds can separate mechanisms); then the rest (seeds, n = 512)."""
    def cells(tasks, ns, mechanisms, seeds):
        return [Cell(t, n, a, s, steps[n]) for n in ns for s in seeds for t in tasks for a in mechanisms]
    order = (
        cells(("listops",), (128,), ("dense", "local", *CPU_MECHANISMS), (0,))
        + cells(("dyck", "pathfinder"), (128,), ("dense", "local"), (0,))
        + cells(("listops",), (512,), ("dense", "local", "noncrossing_defect"), (0,))
        + cells(("listops",), (128,), ("dense", "local", "noncrossing_defect"), (1, 2))
        + cells(("pathfinder", "dyck"), (128,), CPU_MECHANISMS[::-1], (0,))
        + cells(("listops",), (128,), CPU_MECHANISMS, (1, 2))
        + cells(CPU_TASKS, (128,), ("labels",), (0,))
        + cells(("dyck",), (128,), (WARM,), (0, 1, 2))
        + cells(("pathfinder",), (128,), ("dense", "local", *CPU_MECHANISMS), (1, 2))
        + cells(CPU_TASKS, (128,), CPU_ATTENTION, (0, 1, 2))
        + cells(CPU_TASKS, (512,), CPU_ATTENTION, (0, 1, 2))
    )
    return list(dict.fromkeys(order))  # the first occurrence sets a cell's place


GRIDS = {
    "noncrossing": _cells(DOCUMENT_TASKS, ("dense", "local", "noncrossing_defect"), SEEDS),  # 63 cells
    # The other baselines and mechanisms on the same cells.
    "noncrossing_more": _cells(DOCUMENT_TASKS, ("longformer", "bigbird", "abca", "abca_learned", "labels",
                                           "noncrossing_brick", "noncrossing_adjacent"), SEEDS),
    # Only the middle block pair replaced, as the research document's "replace one or two dense blocks" (6 layers).
    "noncrossing_hybrid": _cells({"listops": (512, 2048), "dyck": (512, 2048)},
                             ("dense,dense,noncrossing_defect,noncrossing_defect,dense,dense",), SEEDS),
    "cpu": cpu_cells(),
    "sample": _cells({"digits": (64,)}, ("dense", "local"), (0,)),
}


def _key(row: dict) -> tuple:
    return row.get("task"), row.get("n"), row.get("mechanism"), row.get("seed"), row.get("config"), row.get("steps")


def finished_keys(path: str) -> set[tuple]:
    """Cells with a result line in `path` (unreadable lines are ignored)."""
    keys = set()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    keys.add(_key(json.loads(line)))
                except (json.JSONDecodeError, AttributeError):
                    continue
    return keys


def run_subprocess(argv: list[str], timeout_s: float) -> int:
    """`python -m experiments.classification argv` under `timeout_s` (cell_runs.run_module)."""
    return run_module("experiments.classification", argv, timeout_s)


class LoadSampler:
    """`os.getloadavg()[0]` every `period_s` while a cell runs (wall-clock numbers are taken under this load)."""

    def __init__(self, period_s: float = 5.0):
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(period_s,), daemon=True)
        self._thread.start()

    def _loop(self, period_s):
        while not self._stop.wait(period_s):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        s = self.samples
        return {"start": s[0], "end": s[-1], "mean": sum(s) / len(s), "max": max(s), "samples": len(s)}


def _pop_row(path: str) -> dict | None:
    """The last JSON line a cell's run wrote to its own results file (None if it wrote none)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def append_row(path: str, row: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # grid shards may append to the same file
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
        fcntl.flock(f, fcntl.LOCK_UN)


def run_grid(cells: list[Cell], *, config: str, num_steps: int | None, results_dir: str, runs_dir: str,
             time_limit_s: float, run=run_subprocess, log=print, deadline: float | None = None,
             min_cell_s: float = 0.0, commit: str | None = None, grid: str = "", grid_command: str = "",
             clock=time.time) -> dict[Cell, str]:
    """Run the cells without a result line, in order; returns each cell's status.

    Each cell writes its row to `<workdir>/row.jsonl`; the grid adds the git commit, the load average during the
    cell (sampled every 5 s) and its own command, and appends it to `<results_dir>/<task>.jsonl` (so an
    interrupted grid leaves whole lines only and a rerun skips what is there). `deadline` (a `clock()` time):
    no cell starts with less than `min_cell_s` left, and none runs past it.
    """
    default_steps = CONFIGS[config]().train.num_steps
    commit = commit or git_commit()
    status = {}
    for cell in cells:
        steps = num_steps if num_steps is not None else cell.steps if cell.steps is not None else default_steps
        results = os.path.join(results_dir, f"{cell.task}.jsonl")
        if (cell.task, cell.n, cell.mechanism, cell.seed, config, steps) in finished_keys(results):
            status[cell] = "done before"
            continue
        limit = time_limit_s
        if deadline is not None:
            left = deadline - clock()
            if left < max(min_cell_s, 1.0):
                status[cell] = "not started (deadline)"
                continue
            limit = min(limit, left)
        workdir = os.path.join(runs_dir, config, f"{cell.task}_n{cell.n}_{cell.mechanism.replace(',', '+')}"
                                                 f"_s{cell.seed}")
        os.makedirs(workdir, exist_ok=True)
        if not claim(workdir):
            status[cell] = "running elsewhere"
            continue
        try:
            if (cell.task, cell.n, cell.mechanism, cell.seed, config, steps) in finished_keys(results):
                status[cell] = "done before"  # finished by another grid since the check above
                continue
            status[cell] = _run_cell(cell, config=config, steps=steps, default_steps=default_steps, workdir=workdir,
                                     results=results, limit=limit, run=run, log=log,
                                     extra=dict(git_commit=commit, grid=grid, grid_command=grid_command))
        finally:
            os.remove(os.path.join(workdir, CLAIM))
    return status


CLAIM = "grid.claim"


def claim(workdir: str) -> bool:
    """Take the cell for this process (`<workdir>/grid.claim` holds the pid): parallel grids (`--shard`, or
    another grid on overlapping cells) never train one workdir at once. A claim whose process died is taken over."""
    path = os.path.join(workdir, CLAIM)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path) as f:
                    pid = int(f.read().strip() or 0)
                os.kill(pid, 0)
                return False  # alive
            except (ProcessLookupError, ValueError):
                os.remove(path)  # stale
                continue
            except PermissionError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def attention_argv(attention: str) -> list[str]:
    """classify.py's arguments for a cell's attention name: `<spec>+warm<STEPS>` (the rows' label of a router
    warm start) is `--mechanism <spec> --router_warm_start STEPS`."""
    spec, sep, steps = attention.rpartition("+warm")
    if sep and steps.isdigit():
        return ["--mechanism", spec, "--router_warm_start", steps]
    return ["--mechanism", attention]


def _run_cell(cell: Cell, *, config, steps, default_steps, workdir, results, limit, run, log, extra) -> str:
    """One claimed cell: run it with its own results file, then append its row (+ `extra`, load) to `results`."""
    own = os.path.join(workdir, "row.jsonl")
    if os.path.exists(own):
        os.remove(own)
    argv = ["--task", cell.task, "--n", str(cell.n), *attention_argv(cell.mechanism), "--config", config,
            "--seed", str(cell.seed), "--workdir", workdir, "--results", own]
    if steps != default_steps:
        argv += ["--num_steps", str(steps)]
    log(f"== {cell} -> {workdir} (limit {limit:.0f} s)")
    t0 = time.perf_counter()
    sampler = LoadSampler()
    rc = run(argv, limit)
    load = sampler.stop()
    row = _pop_row(own) if rc == 0 else None
    if rc == 124:
        status = "timed out (rerun to resume)"
    elif rc != 0:
        status = f"failed (exit {rc})"
    elif row is None:
        status = "failed (no result row)"
    else:
        row.update(**extra, load=load, nice=os.nice(0), cell_wall_s=time.perf_counter() - t0)
        append_row(results, row)
        status = "finished"
    log(f"   {status} in {time.perf_counter() - t0:.0f} s (load {load['mean']:.1f})")
    return status


def parse_deadline(text: str | None, now: float | None = None) -> float | None:
    """`HH:MM` (UTC, today; tomorrow if already past) -> a `time.time()` value."""
    if not text:
        return None
    now = time.time() if now is None else now
    try:
        hh, mm = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--deadline must be HH:MM (UTC), got {text!r}") from None
    if not (0 <= hh < 24 and 0 <= mm < 60):
        raise ValueError(f"--deadline must be HH:MM (UTC), got {text!r}")
    day = now - now % 86400
    t = day + hh * 3600 + mm * 60
    return t if t > now else t + 86400


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--grid", choices=sorted(GRIDS), required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="full")
    parser.add_argument("--num_steps", type=int, help="override every cell's steps")
    parser.add_argument("--time_limit", type=float, default=7200, help="seconds per cell")
    parser.add_argument("--deadline", help="HH:MM UTC: start no cell after it (less --min_cell left), stop at it")
    parser.add_argument("--min_cell", type=float, default=60, help="seconds a cell needs to be started")
    parser.add_argument("--only", help="comma-separated mechanism names: run only these cells")
    parser.add_argument("--n", type=int, action="append", help="run only cells of this length (repeatable)")
    parser.add_argument("--task", action="append", help="run only cells of this task (repeatable)")
    parser.add_argument("--seeds", help="comma-separated: run only cells of these seeds")
    parser.add_argument("--skip", help="comma-separated mechanism names: leave these cells out")
    parser.add_argument("--shard", default="0/1", help="i/k: run the cells whose index is i mod k (parallel grids)")
    parser.add_argument("--commit", help="the commit the code was taken from (default: git rev-parse here)")
    parser.add_argument("--results_dir", default=os.path.join("experiments", "results"))
    parser.add_argument("--runs_dir", default=os.path.join("runs", "grid"))
    parser.add_argument("--dry_run", action="store_true", help="list the cells and their status only")
    args = parser.parse_args(argv)
    cells = select(GRIDS[args.grid], only=args.only, skip=args.skip, shard=args.shard, lengths=args.n or (),
                   seeds=args.seeds, tasks=args.task or ())
    deadline = parse_deadline(args.deadline)
    if args.dry_run:
        for cell in cells:
            print(cell)
        return {}
    command = "python -m experiments.classification.grid " + shlex.join(argv if argv is not None else sys.argv[1:])
    status = run_grid(cells, config=args.config, num_steps=args.num_steps, results_dir=args.results_dir,
                      runs_dir=args.runs_dir, time_limit_s=args.time_limit, deadline=deadline,
                      min_cell_s=args.min_cell, commit=args.commit, grid=args.grid, grid_command=command)
    for cell, s in status.items():
        print(f"{s:30s} {cell}")
    return status


def select(cells: list[Cell], *, only: str | None = None, skip: str | None = None, shard: str = "0/1",
           lengths=(), seeds: str | None = None, tasks=()) -> list[Cell]:
    """The cells named by `--only` / `--skip` (mechanism names), `--n`, `--seeds` and `--task`, then every k-th of them
    from the i-th (`--shard i/k`). A name or value the grid does not hold raises a ValueError listing those it does."""
    keep = _chosen("--only", only.split(",") if only else (), {c.mechanism for c in cells}) or None
    drop = _chosen("--skip", skip.split(",") if skip else (), {c.mechanism for c in cells})
    lengths = _chosen("--n", lengths, {c.n for c in cells})
    tasks = _chosen("--task", tasks, {c.task for c in cells})
    try:
        seeds = {int(x) for x in seeds.split(",")} if seeds else set()
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    seeds = _chosen("--seeds", seeds, {c.seed for c in cells})
    try:
        i, k = (int(x) for x in shard.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be i/k (two integers), got {shard!r}") from None
    if not 0 <= i < k:
        raise ValueError(f"--shard must be i/k with 0 <= i < k, got {shard!r}")
    cells = [c for c in cells if (keep is None or c.mechanism in keep) and c.mechanism not in drop
             and (not lengths or c.n in lengths) and (not seeds or c.seed in seeds) and (not tasks or c.task in tasks)]
    return cells[i::k]


def _chosen(flag: str, values, allowed: set) -> set:
    """`values` as a set, each one of `allowed` (the grid's), else a ValueError naming the flag and the choices."""
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"{flag} {', '.join(map(str, unknown))} is not in this grid; choose from "
                         f"{', '.join(map(str, sorted(allowed)))}")
    return set(values)


if __name__ == "__main__":
    main()
