"""Evaluate a run's checkpoint (byte LM or classifier) on its validation data or on a given text file.

    .venv/bin/python -m experiments.evaluate --workdir runs/lm_smoke               # latest step, its validation set
    .venv/bin/python -m experiments.evaluate --workdir runs/lm_smoke --step 250 --text notes.txt

The run's configuration is read from the checkpoint (every checkpoint stores it, `sparse_attn/train/run_config.py`),
the model is rebuilt from it and the train state restored; no flags repeat the training command. Metrics are the
training run's evaluation metrics, computed by the same functions at the checkpoint's train step (so step-scheduled
layers, label attention, run the phase they were trained in): LM validation `nll` and `bits_per_byte` over the same
`eval_batches` windows; classifier accuracy (per ListOps depth / Dyck distance bucket) and loss over the same
validation examples. `--text FILE` (LM only) evaluates every whole `seq_len` window of that file instead.
A missing workdir, a workdir without checkpoints, an absent step, a checkpoint without a stored config, a config
naming a field this code does not know, or arrays that do not fit the model the config describes each raise an
error naming the problem (`CheckpointError`).

Writes: nothing; prints the metrics as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn import data as data_lib
from sparse_attn import models, modules
from sparse_attn import train as train_lib
from sparse_attn.data import tasks as tasks_lib
from sparse_attn.studies import classification as cm
from sparse_attn.studies import cli
from sparse_attn.studies import lm as lm_objective
from sparse_attn.studies.tasks import task_buckets
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

    kind: str  # "lm" or "classify"
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


def run_kind(stored: dict) -> str:
    if "task_name" in stored:
        return "classify"
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
        cls = models.TransformerLM if kind == "lm" else models.TransformerClassifier

        def make_model(rngs):
            model = cls(model_config, rngs=rngs)
            fit_schedules(model, tc.num_steps)
            return model

        one_device = dataclasses.replace(tc, num_devices=1, mesh_data=1, mesh_fsdp=1)
        mesh = mesh_lib.make_mesh(one_device)
        tx = state_lib.make_optimizer(tc)
        shapes, shardings = state_lib.abstract_state(make_model, tx, one_device, mesh)
        target = state_lib.with_shardings(shapes, shardings)
        try:
            state, _ = checkpoint.restore(manager, target, step)
        except Exception as e:  # noqa: BLE001 — any failure here means the arrays do not fit the model
            raise CheckpointError(f"checkpoint step {step} in {workdir!r} does not fit the model its config "
                                  f"describes ({type(e).__name__}: {str(e)[:400]})") from e
    model = nnx.merge(state_lib.graphdef_of(make_model), state.params, state.rest)
    fit_schedules(model, tc.num_steps)
    model.eval()
    return Restored(kind, workdir, int(state.step), stored, tc, model_config, model, notes)


# ---------------------------------------------------------------------------------------------- evaluation

def _mean_metrics(eval_fn, model, step: int, batches: Iterable[dict]) -> tuple[dict, int]:
    graphdef, state = nnx.split(model)

    @jax.jit
    def one(state, batch):
        m = eval_fn(nnx.merge(graphdef, state), batch, jnp.int32(step))
        return {k: jnp.asarray(v, jnp.float32) for k, v in m.items()}

    sums, n = None, 0
    for batch in batches:
        m = one(state, jax.tree.map(jnp.asarray, batch))
        sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
        n += 1
    if n == 0:
        raise ValueError("no evaluation batch")
    return {k: float(v) / n for k, v in jax.device_get(sums).items()}, n


def text_windows(path: str, *, seq_len: int, global_batch: int, max_batches: int | None = None):
    """Every whole `seq_len + 1`-byte window of a file (non-overlapping) in batches; the last partial batch dropped."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no text file {path!r}")
    with open(path, "rb") as f:
        tokens = np.frombuffer(f.read(), np.uint8)
    windows = (tokens.size - 1) // seq_len
    if windows < global_batch:
        raise ValueError(f"{path!r} ({tokens.size} bytes) holds {windows} windows of {seq_len + 1} bytes, fewer "
                         f"than one batch of {global_batch}")
    num = windows // global_batch if max_batches is None else min(windows // global_batch, max_batches)
    for i in range(num):
        starts = (np.arange(global_batch) + i * global_batch) * seq_len
        rows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        yield {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


def evaluate_lm(run: Restored, text: str | None = None, max_batches: int | None = None) -> dict:
    tc = run.train
    if text is not None:
        batches, source = text_windows(text, seq_len=tc.seq_len, global_batch=tc.global_batch,
                                       max_batches=max_batches), text
    else:
        corpus = from_json(run.stored["data"], path="data").load()
        fingerprint = lm_objective.corpus_fingerprint(corpus)
        if fingerprint != run.stored["corpus"]:
            raise CheckpointError(f"the run's validation data changed since it was trained: stored "
                                  f"{run.stored['corpus']}, now {fingerprint}")
        num = tc.eval_batches if max_batches is None else min(max_batches, tc.eval_batches)
        batches = data_lib.eval_batches(corpus.valid_U8, global_batch=tc.global_batch, seq_len=tc.seq_len,
                                        num_batches=num)
        source = "validation"
    metrics, n = _mean_metrics(lm_objective.eval_fn, run.model, run.step, batches)
    return {"kind": "lm", "step": run.step, "data": source, "batches": n, **metrics}


def evaluate_classifier(run: Restored) -> dict:
    tc, stored = run.train, run.stored
    task = from_json(stored["task"], path="task")
    buckets = task_buckets(task)
    valid = tasks_lib.eval_batches(task.source("validation"), global_batch=tc.global_batch,
                                   num_examples=stored["num_validation"])
    eval_fn = cm.make_eval_fn(run.model_config, tc.seq_len, buckets)
    sums, n = _mean_metrics(eval_fn, run.model, run.step, valid)
    m = run.model_config
    out = cm.summarize(sums, buckets, heads=m.num_heads, head_dim=m.model_dim // m.num_heads)
    return {"kind": "classify", "step": run.step, "task": stored["task_name"], "batches": n,
            "accuracy": out["accuracy"], "valid_loss": out["valid_loss"],
            "accuracy_by_bucket": out.get("accuracy_by_bucket")}


def evaluate(workdir: str, step: int | None = None, text: str | None = None, max_batches: int | None = None) -> dict:
    run = restore(workdir, step)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    if run.kind == "lm":
        return evaluate_lm(run, text, max_batches)
    if text is not None:
        raise ValueError("--text evaluates byte LMs; this checkpoint is a classifier (it uses its task's data)")
    return evaluate_classifier(run)


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--workdir", required=True, help="the training run's workdir")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--text", help="LM runs: evaluate on this text file instead of the validation set")
    parser.add_argument("--max_batches", type=int, help="evaluate at most this many batches")
    args = parser.parse_args(argv)
    result = evaluate(args.workdir, args.step, args.text, args.max_batches)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
