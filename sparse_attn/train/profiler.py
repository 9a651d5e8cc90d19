"""A `jax.profiler` trace of a range of training steps (`train_and_evaluate(..., profile_steps=(a, b))`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax


def trace_dir(workdir: str) -> str:
    """Where the trace goes: `<workdir>/profile` (one `plugins/profile/<date>/` folder per trace)."""
    return os.path.join(workdir, "profile")


def start(workdir: str, step: int, log: Callable[[str], None]) -> bool:
    """Starts a trace (on every process: each writes its own host's file); returns True."""
    jax.profiler.start_trace(trace_dir(workdir))
    log(f"profiling from step {step} into {trace_dir(workdir)}")
    return True


def stop(outputs, step: int, log: Callable[[str], None]) -> bool:
    """Waits for `outputs` (the last traced step's results), stops the trace; returns False."""
    if outputs is not None:
        jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    log(f"profile written up to step {step}")
    return False
