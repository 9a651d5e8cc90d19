"""A run's checkpoint back as a model: the config stored with every checkpoint (`sparse_attn/train/run_config.py`)
turned back into its dataclasses, the model rebuilt from it and the train state restored. Every way this can fail
(no run directory, no checkpoint, an absent step, no stored config, an unknown field, arrays that do not fit) raises
`CheckpointError` naming the problem."""

from __future__ import annotations

import dataclasses
import os

from flax import nnx

from sparse_attn import data as data_lib
from sparse_attn import models, modules
from sparse_attn import train as train_lib
from sparse_attn.data import tasks as tasks_lib
from sparse_attn.train import checkpoint, run_config
from sparse_attn.train import mesh as mesh_lib
from sparse_attn.train import state as state_lib
from sparse_attn.train.config import TrainConfig


class CheckpointError(ValueError):
    """A checkpoint that is missing, or that does not match the model its stored config describes."""


def _dataclass_types() -> dict[str, type]:
    """Config classes a stored run config may name, by class name (`run_config.to_json` stores `_type`)."""
    out = {}
    for mod in (modules, models, data_lib, tasks_lib, train_lib):
        for obj in vars(mod).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                out[obj.__name__] = obj
    return out


def from_json(obj, types: dict[str, type] | None = None, path: str = ""):
    """The inverse of `run_config.to_json`: dicts with `_type` become those dataclasses, lists tuples."""
    types = _dataclass_types() if types is None else types
    if isinstance(obj, dict) and "_type" in obj:
        name = obj["_type"]
        if name not in types:
            raise CheckpointError(f"the checkpoint's config names {name} at {path or 'the top'}, which this code "
                                  "does not define (a run from another version?)")
        cls = types[name]
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(obj) - set(fields) - {"_type"})
        if unknown:
            raise CheckpointError(f"the checkpoint's {name} at {path or 'the top'} has fields {unknown} that this "
                                  "code's class does not (a run from another version?)")
        kw = {k: from_json(v, types, f"{path}.{k}" if path else k) for k, v in obj.items() if k != "_type"}
        return cls(**kw)
    if isinstance(obj, dict):
        return {k: from_json(v, types, f"{path}.{k}" if path else k) for k, v in obj.items()}
    if isinstance(obj, list):
        return tuple(from_json(v, types, f"{path}.{i}") for i, v in enumerate(obj))
    return obj


@dataclasses.dataclass
class Restored:
    """A run restored from one checkpoint."""

    kind: str  # "lm", "retrieval" (an LM on a generated task) or "classify"
    workdir: str
    step: int  # the checkpoint's train step
    stored: dict  # the run config as stored
    train: TrainConfig
    model_config: models.TransformerConfig
    model: nnx.Module
    notes: list[str]  # fields the checkpoint predates (their defaults are used)


def _manager(workdir: str):
    ckpt_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
    if not os.path.isdir(workdir):
        raise CheckpointError(f"no run directory {workdir!r}")
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"{workdir!r} holds no checkpoints/ directory (was it trained?)")
    return checkpoint.make_manager(workdir, TrainConfig(async_checkpoints=False))


RETRIEVAL_TASKS = ("AssociativeRecall", "Passkey")  # causal LMs on a generated task (experiments/retrieval/)


def run_kind(stored: dict) -> str:
    if "task_name" in stored:
        task = stored.get("task")
        return "retrieval" if isinstance(task, dict) and task.get("_type") in RETRIEVAL_TASKS else "classify"
    if "corpus" in stored:
        return "lm"
    raise CheckpointError(f"the checkpoint's config is neither an LM run nor a classifier run (keys {sorted(stored)})")


def fit_schedules(model: nnx.Module, num_steps: int) -> None:
    """Scale step-scheduled submodules to the run's length, as the train loop does (label attention)."""
    for _, module in nnx.iter_modules(model):
        fit = getattr(module, "fit_schedule", None)
        if callable(fit):
            fit(num_steps)


def restore(workdir: str, step: int | None = None) -> Restored:
    """Rebuild the model from the config stored at `step` (default: the latest) and restore its weights."""
    with _manager(workdir) as manager:
        steps = sorted(manager.all_steps())
        if not steps:
            raise CheckpointError(f"{workdir!r} has no checkpoint (checkpoints/ is empty)")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(f"{workdir!r} has no checkpoint at step {step}; it has steps {steps}")
        stored = checkpoint.read_config(manager, step)
        if stored is None:
            raise CheckpointError(f"checkpoint step {step} in {workdir!r} stores no run config (written before "
                                  "configs were stored), so its model cannot be rebuilt")
        kind = run_kind(stored)
        tc = from_json(stored["train"], path="train")
        model_config = from_json(stored["model"], path="model")
        rebuilt = run_config.to_json({"train": tc, "model": model_config})
        diffs = run_config.differences({"train": stored["train"], "model": stored["model"]}, rebuilt)
        notes = [f"{k}: not in the checkpoint; default {new!r} used" for k, (old, new) in diffs.items()
                 if old == "<absent>"]
        wrong = {k: v for k, v in diffs.items() if v[0] != "<absent>"}
        if wrong:
            raise CheckpointError(f"the stored config does not rebuild exactly: {wrong}")
        cls = models.TransformerClassifier if kind == "classify" else models.TransformerLM

        def make_model(rngs):
            model = cls(model_config, rngs=rngs)
            fit_schedules(model, tc.num_steps)
            return model

        one_device = dataclasses.replace(tc, num_devices=1, mesh_data=1, mesh_fsdp=1)
        mesh = mesh_lib.make_mesh(one_device)
        tx = state_lib.make_optimizer(tc)
        shapes, shardings = state_lib.abstract_state(make_model, tx, one_device, mesh)
        target = state_lib.with_shardings(shapes, shardings)
        others = [s for s in steps if s != step]
        other_steps = f"pass --step with one of {others}" if others else "no other step to use"
        try:
            state, _ = checkpoint.restore(manager, target, step)
        except Exception as e:  # noqa: BLE001 — the arrays are unreadable or do not fit the model
            raise CheckpointError(f"checkpoint step {step} in {workdir!r} cannot be read as the model its config "
                                  f"describes ({type(e).__name__}: {str(e)[:400]}); {other_steps}") from e
        try:
            checkpoint.verify(manager, step, state)
        except checkpoint.CorruptCheckpointError as e:
            raise CheckpointError(f"checkpoint {e} in {workdir!r}: it is corrupt; {other_steps}") from e
    model = nnx.merge(state_lib.graphdef_of(make_model), state.params, state.rest)
    fit_schedules(model, tc.num_steps)
    model.eval()
    return Restored(kind, workdir, int(state.step), stored, tc, model_config, model, notes)


# ---------------------------------------------------------------------------------------------- evaluation
