"""What every experiment grid shares: a cell run as a time-limited subprocess, and the commit it ran from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def run_module(module: str, argv: list[str], timeout_s: float) -> int:
    """`python -m module argv`; past `timeout_s` SIGTERM (the train loop saves and exits 143), then SIGKILL after
    120 s more. Returns the exit status, 124 on a timeout."""
    proc = subprocess.Popen([sys.executable, "-m", module, *argv])
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


def git_commit() -> str:
    """$SPARSE_ATTN_COMMIT if set (a device's copy of the tree has no git), else `git rev-parse --short HEAD` of
    the working directory, "+dirty" when experiments/ or sparse_attn/ differ from it; "unknown" outside a
    repository (e.g. a `git archive` snapshot: grids take `--commit`)."""
    if os.environ.get("SPARSE_ATTN_COMMIT"):
        return os.environ["SPARSE_ATTN_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "experiments", "sparse_attn"],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def print_status(status: dict) -> dict:
    """One line per grid cell: how it ended, then the cell; returns `{"status": status}` (a grid's result)."""
    for cell, how in status.items():
        print(f"{how:30s} {cell}")
    return {"status": status}


def default_results(tracked: str, runs_dir: str, *, config: str, scratch: bool = False) -> str:
    """Where a runner appends its rows when `--results` is not given: a study config's cells append to the tracked
    rows (`tracked`, under experiments/results/); the smoke config, or a scratch run (`scratch`: its config
    changed by overrides, so not the study's cell), writes `<runs_dir>/results.jsonl`: trying a command leaves
    `git status` clean."""
    return os.path.join(runs_dir, "results.jsonl") if config == "smoke" or scratch else tracked
