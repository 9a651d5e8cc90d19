"""Metrics out of the loop: a JSONL file, optional TensorBoard, and a tqdm bar (process 0 only)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import tqdm

METRICS_FILE = "metrics.jsonl"


def _scalar(v):
    v = np.asarray(v)
    return v.item() if v.size == 1 else v.tolist()


def own_records(workdir: str, restored_step: int | None, log: Callable[[str], None]) -> None:
    """Makes `<workdir>`'s records this run's alone, before it writes any: a run that starts from scratch moves an
    earlier run's `metrics.jsonl` and `tensorboard/` aside (`*.earlier-<k>`: a run killed before its first
    checkpoint, whatever its config); a run resumed at step s drops the records after s (its interrupted tail,
    re-run now), so no reader ever mixes two runs' steps."""
    path = os.path.join(workdir, METRICS_FILE)
    if restored_step is None:
        for name in (METRICS_FILE, "tensorboard"):
            old = os.path.join(workdir, name)
            if os.path.exists(old):
                k = 1
                while os.path.exists(f"{old}.earlier-{k}"):
                    k += 1
                os.replace(old, f"{old}.earlier-{k}")
                log(f"no checkpoint: an earlier run's {name} moved to {name}.earlier-{k}")
        return
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = [line for line, step in zip(lines, map(_step_of, lines), strict=True)
            if step is not None and step <= restored_step]
    if len(kept) != len(lines):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, path)
        log(f"resume at step {restored_step}: {len(lines) - len(kept)} records after it dropped (re-run now)")


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a line cut by a kill
        return None


class MetricsWriter:
    """Appends `{"step", "split", ...}` records to `<workdir>/metrics.jsonl` (and TensorBoard); `own_records`
    first makes the file this run's alone."""

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = False):
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._file = open(os.path.join(workdir, METRICS_FILE), "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter  # noqa: PLC0415 — optional
            except ImportError as e:
                raise ImportError("tensorboard=True needs tensorboardX: pip install tensorboardX") from e
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, split: str, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "split": split, **{k: _scalar(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if k not in ("step", "split") and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{split}/{k}", v, step)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def read_metrics(workdir: str, split: str = "train") -> dict[int, dict]:
    """The last record of each step of `split` (later runs override an interrupted one)."""
    out = {}
    with open(os.path.join(workdir, METRICS_FILE)) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            if record["split"] == split:
                out[record["step"]] = record
    return dict(sorted(out.items()))


class Progress:
    """tqdm bar with loss and tokens/s; tqdm itself shows step, rate and ETA."""

    def __init__(self, *, total: int, initial: int, tokens_per_step: int, enabled: bool):
        # Not a terminal (a log file, a grid's subprocess): a plain line every 10-30 s (30 s is tqdm's minimum
        # interval here; its 10 s monitor may refresh sooner: ~15 s on the smoke LM), not a bar redrawn every 0.1 s.
        interval = 0.1 if sys.stderr.isatty() else 30.0
        self._bar = tqdm.tqdm(total=total, initial=initial, disable=not enabled, unit="step",
                              dynamic_ncols=True, smoothing=0.1, mininterval=interval)
        self._tokens_per_step = tokens_per_step
        self._initial = initial
        self._t0 = None
        self.tokens_per_s = math.nan

    def start(self) -> None:
        """Call when the first step is dispatched (after compilation)."""
        self._t0 = time.perf_counter()

    def update(self, step: int, loss: float) -> None:
        """`step`: number of updates completed (host-synced)."""
        if self._t0 is not None and step > self._initial:
            # Average since the loop started, evaluation and checkpoint pauses included.
            self.tokens_per_s = (step - self._initial) * self._tokens_per_step / (time.perf_counter() - self._t0)
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{self.tokens_per_s:,.0f}", refresh=False)

    def log(self, log, msg: str) -> None:
        """`log(msg)` (the run's log callable) with the bar cleared around it."""
        with tqdm.tqdm.external_write_mode():
            log(msg)

    def close(self) -> None:
        self._bar.close()


def memory_report(compiled) -> dict:
    """The compiled step's memory analysis in MiB (fields vary by backend; missing ones skipped)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    return {
        f.replace("_size_in_bytes", "_mib"): getattr(analysis, f) / 2**20
        for f in fields if hasattr(analysis, f)
    }


def device_summary(mesh) -> dict:
    return {
        "backend": jax.default_backend(),
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(),
        "mesh": dict(mesh.shape),
    }
