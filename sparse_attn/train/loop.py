"""The shared train loop: mesh -> model/opt -> shard -> restore -> step -> eval -> loop.

Forkable by design: one function in banner-marked sections. Experiments supply the model
factory, `loss_fn`, `eval_fn` and the data; see `experiments/lm.py`.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sparse_attn.train import checkpoint, reporting
from sparse_attn.train import mesh as mesh_lib
from sparse_attn.train import state as state_lib
from sparse_attn.train import step as step_lib
from sparse_attn.train.config import TrainConfig


class ResumableIterator(Protocol):
    def __next__(self) -> dict: ...
    def get_state(self) -> dict: ...
    def set_state(self, state: dict) -> None: ...


class NonFiniteLossError(FloatingPointError):
    """The loss or gradient norm became NaN/Inf; the run stopped without saving that state."""


class _DeferredInterrupt:
    """Turns the first Ctrl-C into a request the loop honours between steps.

    A KeyboardInterrupt raised inside a step call would drop the new state after the old one
    was donated (deleted), leaving nothing to save. A second Ctrl-C interrupts immediately.
    """

    def __init__(self):
        self.requested = False
        self._previous = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # signals only work there
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.restore()

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def _check_finite(step: int, metrics: dict, last_good: int | None, ckpt_dir: str) -> None:
    bad = {k: metrics[k] for k in ("loss", "grad_norm") if not math.isfinite(metrics[k])}
    if bad:
        where = f"step {last_good} in {ckpt_dir}" if last_good is not None else "none saved yet"
        raise NonFiniteLossError(f"non-finite {bad} at step {step}; stopped. Last good checkpoint: {where}")


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
    log: Callable[[str], None] = print,
) -> dict:
    """Train to `config.num_steps` (resuming from `workdir` if it holds a checkpoint).

    Args:
      make_model: `rngs -> nnx.Module`; called abstractly once and inside the jitted init.
      loss_fn: `(model, batch, step) -> (loss, metrics)`.
      eval_fn: `(model, batch) -> metrics`; averaged over the (equal-sized) eval batches.
      train_iter: yields this process's rows of each global batch; resumable.
      eval_batches: a fresh iterable of this process's rows of each eval batch.
      tokens_per_batch: for tokens/s (default `global_batch * seq_len`).
    Returns:
      A summary: steps, parameter count, memory, last train metrics, final eval metrics.
    """
    t_start = time.perf_counter()
    is_main = jax.process_index() == 0
    info = (lambda msg: log(msg)) if is_main else (lambda msg: None)
    tokens_per_batch = tokens_per_batch or config.global_batch * config.seq_len

    # ------------------------------------------------------------------ mesh
    mesh = mesh_lib.make_mesh(config)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    replicated = NamedSharding(mesh, P())
    info(f"devices: {reporting.device_summary(mesh)}")

    # ------------------------------------------------------------------ model and optimizer (abstract)
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
        in_shardings=(shardings.params, shardings.rest, batch_sharding),
        out_shardings=replicated,
    )

    def evaluate(state) -> dict:
        sums, n = None, 0
        for i, local in enumerate(eval_batches()):
            m = eval_step(state.params, state.rest, mesh_lib.shard_batch(local, mesh))
            sums = m if sums is None else jax.tree.map(lambda a, b: a + b, sums, m)
            n += 1
            if (i + 1) % config.sync_every == 0:
                jax.block_until_ready(sums)  # bound the steps in flight (CPU deadlock)
        if n == 0:
            raise ValueError("eval_batches() yielded no batch")
        return {k: float(v) / n for k, v in jax.device_get(sums).items()}

    summary = {"param_count": n_params, "num_devices": int(mesh.devices.size)}
    with jax.set_mesh(mesh), checkpoint.make_manager(workdir, config) as manager:
        ckpt_dir = str(manager.directory)

        # -------------------------------------------------------------- restore or initialize
        restored = checkpoint.restore(manager, state_lib.with_shardings(shapes, shardings))
        if restored is None:
            state = state_lib.init_state(make_model, tx, config, shardings)
            info("no checkpoint: initialized from scratch")
        else:
            state, data_state = restored
            train_iter.set_state(data_state)
            info(f"resumed from {ckpt_dir} at step {int(state.step)}")
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
                _check_finite(s, m, manager.latest_step(), ckpt_dir)
                writer.write(s, "train", m)
                progress.update(s, m["loss"])
                last_train = {"step": s, **m}
                del pending[0]  # only once logged: a Ctrl-C mid-flush loses no step

        def save() -> None:
            # No batch is fetched-but-unused when we save: the iterator state matches `step`.
            checkpoint.save(manager, step, state, train_iter.get_state())

        writer = reporting.MetricsWriter(workdir, enabled=is_main, tensorboard=config.tensorboard)
        progress = None
        interrupt = _DeferredInterrupt()
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
            while step < config.num_steps and not interrupt.requested:
                if batch is None:
                    batch = mesh_lib.shard_batch(next(train_iter), mesh)
                state, metrics = compiled(state, batch)
                batch = None
                step += 1
                pending.append((step, metrics))
                # Metrics of step t-1 are read after step t is dispatched: the device stays busy.
                # Reading them syncs the host: never more than `sync_every` steps go unsynced.
                if len(pending) >= max(config.sync_every, 2):
                    flush(keep_last=True)
                boundary_ckpt = step % config.checkpoint_every == 0 or step == config.num_steps
                boundary_eval = step % config.eval_every == 0 or step == config.num_steps
                if boundary_ckpt or boundary_eval:
                    flush(keep_last=False)  # never save or evaluate a state we have not checked
                if boundary_eval:
                    eval_metrics = evaluate(state)
                    writer.write(step, "valid", eval_metrics)
                    summary["eval"] = {"step": step, **eval_metrics}
                    msg = f"step {step}: valid " + " ".join(f"{k}={v:.4f}" for k, v in eval_metrics.items())
                    progress.write(msg) if config.progress else info(msg)
                if boundary_ckpt:
                    save()
            flush(keep_last=False)
            if interrupt.requested:
                # Keep the work done so far: the last dispatched state, checked above, then saved.
                if manager.latest_step() != step:
                    save()
                raise KeyboardInterrupt(f"interrupted after step {step}; saved it to {ckpt_dir}")
        finally:
            interrupt.restore()
            if progress is not None:
                progress.close()
            writer.close()
            # Leaving the `with` waits for async saves (Orbax drops unfinished ones at exit).

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
