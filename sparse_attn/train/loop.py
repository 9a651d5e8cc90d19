"""The shared train loop: mesh -> model/opt -> shard -> restore -> step -> eval -> loop.

Forkable by design: one function in banner-marked sections. Experiments supply the model
factory, `loss_fn`, `eval_fn` and the data; see `experiments/lm/train.py`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sparse_attn.train import checkpoint, distributed, guard, profiler, reporting, run_config, workdir_lock
from sparse_attn.train import mesh as mesh_lib
from sparse_attn.train import state as state_lib
from sparse_attn.train import step as step_lib
from sparse_attn.train.config import TrainConfig
from sparse_attn.train.guard import NonFiniteLossError
from sparse_attn.train.interrupt import DeferredInterrupt

__all__ = ["NonFiniteLossError", "ResumableIterator", "train_and_evaluate"]


class ResumableIterator(Protocol):
    def __next__(self) -> dict: ...
    def get_state(self) -> dict: ...
    def set_state(self, state: dict) -> None: ...


def _first_batch(eval_batches: Callable[[], Iterable[dict]]) -> dict:
    """Build one eval batch before training: a too-short validation set fails now, not after hours."""
    for batch in eval_batches():
        return batch
    raise ValueError("eval_batches() yielded no batch")


def _fitted(make_model: state_lib.ModelFactory, num_steps: int, info: Callable[[str], None]):
    """`make_model` whose step-scheduled submodules are scaled to the run (`fit_schedule`); notes said once."""
    said: set[str] = set()

    def make(rngs):
        model = make_model(rngs)
        for path, module in nnx.iter_modules(model):
            fit = getattr(module, "fit_schedule", None)
            for note in fit(num_steps) if callable(fit) else ():
                msg = f"{'/'.join(map(str, path)) or type(module).__name__}: {note}"
                if msg not in said:
                    said.add(msg)
                    info(f"warning: {msg}")
        return model

    return make


def _schedule_change(stored: dict, config: TrainConfig, step: int) -> str:
    """The learning rate at the resume step under the stored and the current schedule."""
    old = TrainConfig(**{k: v for k, v in stored["train"].items() if k != "_type"})
    lr_old = float(state_lib.learning_rate_schedule(old)(step))
    lr_new = float(state_lib.learning_rate_schedule(config)(step))
    return f"learning rate at step {step}: {lr_old:.6g} under the checkpoint's schedule, {lr_new:.6g} from now on"


def train_and_evaluate(
    config: TrainConfig,
    workdir: str,
    *,
    make_model: state_lib.ModelFactory,
    loss_fn: step_lib.LossFn,
    eval_fn: step_lib.EvalFn,
    train_iter: ResumableIterator,
    eval_batches: Callable[[], Iterable[dict]],
    tokens_per_batch: int | None = None,
    experiment: dict | None = None,
    allowed_changes: Collection[str] = (),
    log: Callable[[str], None] = print,
    warm_start: Callable[[nnx.Module], None] | None = None,
    profile_steps: tuple[int, int] | None = None,
    eval_summary: Callable[[dict], dict] | None = None,
) -> dict:
    """Train to `config.num_steps` (resuming from `workdir` if it holds a checkpoint).

    Args:
      make_model: `rngs -> nnx.Module`; called abstractly once and inside the jitted init. Submodules with a
        `fit_schedule(num_steps) -> notes` method (label attention) are scaled to `config.num_steps` here; the
        notes (phases the run cuts short) are logged once, as warnings.
      loss_fn: `(model, batch, step) -> (loss, metrics)`.
      eval_fn: `(model, batch, step) -> metrics` with the state's step; averaged over the (equal-sized) eval
        batches.
      train_iter: yields this process's rows of each global batch; resumable.
      eval_batches: a fresh iterable of this process's rows of each eval batch.
      tokens_per_batch: for tokens/s (default `global_batch * seq_len`).
      experiment: the rest of the run's configuration (model, data, ...: dataclasses or JSON),
        stored with each checkpoint with `config` and compared on resume.
      allowed_changes: fnmatch patterns of config paths (`train.num_steps`) that may differ from
        the checkpoint's on resume, besides `run_config.ALWAYS_ALLOWED`.
      warm_start: `model -> None`, run once on the freshly initialized model (never on resume) to update it in
        place before step 0, e.g. a supervised pre-fit of a router; the optimizer state starts from its result.
        It must be deterministic: a run that stops before its first checkpoint runs it again. Record what it
        does in `experiment`, so that a resume under a different warm start is refused.
      profile_steps: (a, b): a `jax.profiler` trace of the steps that take the step counter from a to b, written
        to `<workdir>/profile` (TensorBoard's profile plugin or Perfetto read it; docs/training.md). The trace
        starts after the compile and stops once step b's results are on the host; a run that resumes past a
        traces nothing.
      eval_summary: `metrics -> {name: value}`, what an evaluation's log line shows (e.g. accuracy = correct /
        count where `eval_fn` returns sums); default the metrics themselves. The metrics file keeps them all.
    Returns:
      A summary: steps, parameter count, memory, last train metrics, final eval metrics.
    """
    t_start = time.perf_counter()
    if profile_steps is not None:
        a, b = profile_steps
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b):
            raise ValueError(f"profile_steps must be (a, b) with 0 <= a < b, got {profile_steps!r}")
    is_main = jax.process_index() == 0
    info = (lambda msg: log(msg)) if is_main else (lambda msg: None)
    tokens_per_batch = tokens_per_batch or config.global_batch * config.seq_len
    this_run = run_config.record(config, experiment)

    # ------------------------------------------------------------------ data sizes (before any compile)
    _first_batch(eval_batches)

    # ------------------------------------------------------------------ mesh
    mesh = mesh_lib.make_mesh(config)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    info(f"devices: {reporting.device_summary(mesh)}")

    # ------------------------------------------------------------------ model and optimizer (abstract)
    make_model = _fitted(make_model, config.num_steps, info)
    tx = state_lib.make_optimizer(config)
    lr_schedule = state_lib.learning_rate_schedule(config)
    graphdef = state_lib.graphdef_of(make_model)
    shapes, shardings = state_lib.abstract_state(make_model, tx, config, mesh)
    n_params = state_lib.param_count(shapes)
    info(f"parameters: {n_params:,}")

    # ------------------------------------------------------------------ steps (jitted, state donated)
    train_step = jax.jit(
        step_lib.make_train_step(graphdef, tx, loss_fn, lr_schedule),
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )
    eval_step = jax.jit(
        step_lib.make_eval_step(graphdef, eval_fn),
        in_shardings=(shardings.params, shardings.rest, replicated, batch_sharding),
        out_shardings=replicated,
    )

    def evaluate(state) -> dict:
        sums, n = None, 0
        for i, local in enumerate(eval_batches()):
            m = eval_step(state.params, state.rest, state.step, mesh_lib.shard_batch(local, mesh))
            sums = m if sums is None else jax.tree.map(lambda a, b: a + b, sums, m)
            n += 1
            if (i + 1) % config.sync_every == 0:
                jax.block_until_ready(sums)  # bound the steps in flight (CPU deadlock)
        if n == 0:
            raise ValueError("eval_batches() yielded no batch")
        return {k: float(v) / n for k, v in jax.device_get(sums).items()}

    def check_config(step: int, stored: dict) -> None:
        changed = run_config.check_resume(stored, this_run, allowed_changes)
        for path, (old, new) in changed.items():
            info(f"resume: {path} changed from {old!r} to {new!r} (allowed)")
        if any(path.startswith("train.") and path[6:] in state_lib.SCHEDULE_FIELDS for path in changed):
            info(_schedule_change(stored, config, step))

    summary = {"param_count": n_params, "num_devices": int(mesh.devices.size)}
    # One run per workdir (process 0 holds the lock for all processes of this run).
    lock = workdir_lock.hold(workdir) if is_main else contextlib.nullcontext()
    with lock, jax.set_mesh(mesh), checkpoint.opened(workdir, config) as manager:
        ckpt_dir = str(manager.directory)

        # -------------------------------------------------------------- restore or initialize
        target = state_lib.with_shardings(shapes, shardings)
        restored = checkpoint.restore_newest_readable(manager, target, check_config=check_config, log=info)
        if restored is None:
            state = state_lib.init_state(make_model, tx, config, shardings)
            info("no checkpoint: initialized from scratch")
            if warm_start is not None:
                state = state_lib.warm_started(state, graphdef, warm_start, tx, shardings)
                info("warm start applied to the initial model")
        else:
            restored_step, state, data_state = restored
            train_iter.set_state(data_state)
            info(f"resumed from {ckpt_dir} at step {restored_step}")
        step = int(state.step)

        pending: list[tuple[int, dict]] = []  # dispatched steps whose metrics are not read yet
        last_train: dict = {}

        def flush(keep_last: bool) -> None:
            """Read (host-sync) metrics of dispatched steps; log them; stop on NaN/Inf."""
            nonlocal last_train
            n = len(pending) - 1 if keep_last else len(pending)
            values = jax.device_get([m for _, m in pending[:n]])
            for m in values:
                s = pending[0][0]
                m = {k: float(np.asarray(v)) for k, v in m.items()}
                guard.check_metrics(s, m, manager.latest_step(), ckpt_dir)
                writer.write(s, "train", m)
                progress.update(s, m["loss"])
                last_train = {"step": s, **m}
                del pending[0]  # only once logged: a Ctrl-C mid-flush loses no step

        def save() -> None:
            """Save `state` after checking it; call after `flush(keep_last=False)` (metrics checked)."""
            guard.check_state(step, state, manager.latest_step(), ckpt_dir)
            # No batch is fetched-but-unused when we save: the iterator state matches `step`.
            checkpoint.save(manager, step, state, train_iter.get_state(), this_run)

        if is_main:
            reporting.own_records(workdir, None if restored is None else step, info)
        writer = reporting.MetricsWriter(workdir, enabled=is_main, tensorboard=config.tensorboard)
        progress = None
        tracing = False
        # SIGTERM: a single process handles it itself; with several, JAX's preemption notifier catches it on any
        # host and `preemption_point` stops every process after the same step (no process left in a collective).
        multi = jax.process_count() > 1
        interrupt = DeferredInterrupt(signals=(signal.SIGINT,) if multi else (signal.SIGINT, signal.SIGTERM))
        try:
            # ---------------------------------------------------------- compile; report before step 0
            batch = None
            if step < config.num_steps:
                batch = mesh_lib.shard_batch(next(train_iter), mesh)
                compiled = train_step.lower(state, batch).compile()
                summary["memory_mib"] = {k: round(v, 2) for k, v in reporting.memory_report(compiled).items()}
                info(f"compiled train step memory (MiB): {summary['memory_mib']}")
            progress = reporting.Progress(total=config.num_steps, initial=step, tokens_per_step=tokens_per_batch,
                                          enabled=is_main and config.progress)

            # ---------------------------------------------------------- loop
            progress.start()
            interrupt.install()
            while step < config.num_steps and interrupt.requested is None:
                if batch is None:
                    batch = mesh_lib.shard_batch(next(train_iter), mesh)
                if profile_steps is not None and step == profile_steps[0]:
                    tracing = profiler.start(workdir, step, info)
                state, metrics = compiled(state, batch)
                batch = None
                step += 1
                if tracing and step == profile_steps[1]:
                    tracing = profiler.stop((state, metrics), step, info)
                pending.append((step, metrics))
                checkpoint.raise_if_save_failed(manager)  # a failed background save stops the run now
                # Metrics of step t-1 are read after step t is dispatched: the device stays busy.
                # Reading them syncs the host: never more than `sync_every` steps go unsynced.
                if len(pending) >= max(config.sync_every, 2):
                    flush(keep_last=True)
                boundary_ckpt = step % config.checkpoint_every == 0 or step == config.num_steps
                boundary_eval = step % config.eval_every == 0 or step == config.num_steps
                if boundary_ckpt or boundary_eval:
                    flush(keep_last=False)  # never save or evaluate a state we have not checked
                if boundary_ckpt:
                    save()  # before evaluating: a failing evaluation must not lose the step
                if boundary_eval:
                    eval_metrics = evaluate(state)
                    writer.write(step, "valid", eval_metrics)
                    summary["eval"] = {"step": step, **eval_metrics}
                    shown = eval_summary(eval_metrics) if eval_summary is not None else eval_metrics
                    msg = f"step {step}: valid " + " ".join(f"{k}={float(v):.4f}" for k, v in shown.items())
                    progress.log(info, msg)
                if multi and distributed.preemption_point(step):
                    interrupt.requested = signal.SIGTERM
            flush(keep_last=False)
            if interrupt.requested is not None:
                # Keep the work done so far: the last dispatched state, checked above, then saved.
                if manager.latest_step() != step:
                    save()
                checkpoint.finish_saves(manager)  # the saved step is on disk before we say so
                stop = interrupt.stop(step, ckpt_dir)
                info(str(stop))
                raise stop
        finally:
            if tracing:  # an interrupted or failing run still closes its trace
                profiler.stop(None, step, info)
            interrupt.restore()
            if progress is not None:
                progress.close()
            writer.close()
            # Leaving the `with` waits for async saves (Orbax drops unfinished ones at exit) and
            # raises CheckpointSaveError if one failed.

        if "eval" not in summary:  # restored at or past num_steps: evaluate what we have
            summary["eval"] = {"step": step, **evaluate(state)}
    summary.update(
        step=step,
        train=last_train,
        tokens_per_s=progress.tokens_per_s if progress is not None else math.nan,
        wall_s=time.perf_counter() - t_start,
        checkpoint_dir=ckpt_dir,
    )
    return summary
