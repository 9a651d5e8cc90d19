"""Multi-host start-up: `jax.distributed.initialize` must run before any other JAX call.

On a cluster JAX detects the coordinator itself (SLURM, TPU pods, Open MPI): pass
`coordinator="auto"`. On plain machines give the address of process 0 and each process
its id, e.g. two processes on one host (CPU, gloo collectives):

    python experiments/lm/train.py --coordinator 127.0.0.1:12345 --num_processes 2 --process_id 0 ...
    python experiments/lm/train.py --coordinator 127.0.0.1:12345 --num_processes 2 --process_id 1 ...

Every process runs the same program; each feeds its own rows of the global batch
(`jax.make_array_from_process_local_data`) and only process 0 prints and writes logs.
"""

from __future__ import annotations

import jax
from jax.experimental import multihost_utils


def initialize(coordinator: str | None, num_processes: int | None = None, process_id: int | None = None,
               timeout_s: int = 300) -> None:
    """No-op for `coordinator=None` (single process); `"auto"` lets JAX detect the cluster."""
    if coordinator is None:
        return
    if coordinator == "auto":
        jax.distributed.initialize()
        return
    if num_processes is None or process_id is None:
        raise ValueError("an explicit coordinator needs num_processes and process_id")
    jax.distributed.initialize(
        coordinator, num_processes=num_processes, process_id=process_id, initialization_timeout=timeout_s
    )


def preemption_point(step: int) -> bool:
    """Whether every process should save and stop after `step`: JAX's preemption notifier catches SIGTERM on any
    host, and all processes agree on the first step they have not all passed (called by every process at every
    step). False when the runtime has no preemption sync manager (a multi-process run started outside
    `jax.distributed.initialize`)."""
    from jax._src import distributed as jax_distributed  # noqa: PLC0415  (where JAX keeps the manager)

    if getattr(jax_distributed.global_state, "preemption_sync_manager", None) is None:
        return False
    return multihost_utils.reached_preemption_sync_point(step)
