"""Orbax checkpoints: train state and data-iterator state saved together, one step per directory.

Layout: `<workdir>/checkpoints/<step>/{state,data}`. Orbax writes a save into
`<step>.orbax-checkpoint-tmp*` and renames it when complete, so a crash mid-save leaves the
previous step restorable. Async saves must be finished before exit: use the manager as a
context manager (its `close()` waits).
"""

from __future__ import annotations

import os

import orbax.checkpoint as ocp

from sparse_attn.train.config import TrainConfig

STATE, DATA = "state", "data"


def make_manager(workdir: str | os.PathLike, config: TrainConfig) -> ocp.CheckpointManager:
    """Keep the latest `keep_checkpoints` steps, plus every `keep_period`-th step if set."""
    policies = [ocp.checkpoint_managers.LatestN(config.keep_checkpoints)]
    if config.keep_period:
        policies.append(ocp.checkpoint_managers.EveryNSteps(config.keep_period))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
        enable_async_checkpointing=config.async_checkpoints,
        create=True,
    )
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    return ocp.CheckpointManager(directory, options=options, item_names=(STATE, DATA))


def save(manager: ocp.CheckpointManager, step: int, state, data_state: dict) -> None:
    """Start saving `state` (any pytree of jax arrays) and `data_state` (a JSON dict) at `step`."""
    manager.save(
        step,
        args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state), DATA: ocp.args.JsonSave(data_state)}),
        force=True,  # the loop decides when to save; no save-interval policy here
    )


def restore(manager: ocp.CheckpointManager, target, step: int | None = None):
    """Restore `(state, data_state)` at `step` (default latest) or return None if there is none.

    `target` is a tree of `ShapeDtypeStruct`s with shardings: arrays land directly in that
    layout, so a checkpoint written on one device count restores onto another.
    """
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    out = manager.restore(
        step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target), DATA: ocp.args.JsonRestore()})
    )
    return out[STATE], out[DATA]
