"""The NaN/Inf guard: stop on non-finite metrics, and never save (or call good) a non-finite state.

The loss and gradient norm of step t are computed *before* update t, so finite metrics do not
prove the state after the update is finite: a diverging update on a checkpoint step would be
saved and later named "last good checkpoint". So the state itself is checked before each save.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

GUARDED_METRICS = ("loss", "grad_norm")
STATE_PARTS = ("params", "rest", "opt_state")


class NonFiniteLossError(FloatingPointError):
    """The loss, the gradient norm or the updated state became NaN/Inf; that state was not saved."""


def _last_good(last_good: int | None, ckpt_dir: str) -> str:
    where = f"step {last_good} in {ckpt_dir}" if last_good is not None else "none saved yet"
    return f"Last good checkpoint: {where}"


def check_metrics(step: int, metrics: dict, last_good: int | None, ckpt_dir: str) -> None:
    bad = {k: metrics[k] for k in GUARDED_METRICS if not math.isfinite(metrics[k])}
    if bad:
        raise NonFiniteLossError(f"non-finite {bad} at step {step}; stopped. {_last_good(last_good, ckpt_dir)}")


@jax.jit
def _finite_parts(state) -> dict:
    def all_finite(tree):
        leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
        return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)

    return {part: all_finite(getattr(state, part)) for part in STATE_PARTS}


def check_state(step: int, state, last_good: int | None, ckpt_dir: str) -> None:
    """Raise if any float leaf of the state to be saved is NaN/Inf (one fused reduction on device)."""
    bad = [part for part, ok in jax.device_get(_finite_parts(state)).items() if not ok]
    if bad:
        raise NonFiniteLossError(
            f"non-finite values in the state after step {step} ({', '.join(bad)}) although the loss and "
            f"grad_norm of that step were finite: a diverging update; stopped without saving it. "
            f"{_last_good(last_good, ckpt_dir)}"
        )
