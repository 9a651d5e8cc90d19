"""The device mesh ("data", "fsdp") and the sharding rules for state and batches."""

from __future__ import annotations

import os
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sparse_attn.train.config import TrainConfig

DATA, FSDP = "data", "fsdp"
BATCH_AXES = (DATA, FSDP)  # the batch is split over both axes; FSDP also shards the state


def make_mesh(config: TrainConfig) -> jax.sharding.Mesh:
    """A 2-D mesh with Auto axes (pjit-style propagation; jax.make_mesh defaults to Explicit axes)."""
    devices = jax.devices()
    if config.num_devices is not None:
        if config.num_devices > len(devices):
            raise ValueError(f"num_devices={config.num_devices} but only {len(devices)} devices exist")
        devices = devices[: config.num_devices]
    n = len(devices)
    fsdp = config.mesh_fsdp
    data = n // fsdp if config.mesh_data == -1 else config.mesh_data
    if data * fsdp != n:
        raise ValueError(f"mesh data={data} x fsdp={fsdp} does not use exactly the {n} devices")
    if config.global_batch % n:
        raise ValueError(f"global_batch={config.global_batch} is not divisible by {n} devices")
    _warn_if_cpu_pool_small(devices)
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((data, fsdp), (DATA, FSDP), axis_types=auto, devices=devices)


CPU_THREADS_PER_DEVICE = 4


def _warn_if_cpu_pool_small(devices) -> None:
    """XLA:CPU runs every device of a launch, and the collectives inside it, on one thread pool of PJRT_NPROC
    threads. A collective blocks its thread until all devices arrive; when the devices
    reach two independent collectives in different orders and the blocked threads fill the pool, the run
    deadlocks and XLA aborts the process after 40 s ("Termination timeout for all reduce"). Seen with 8 devices
    on 2 cores within 2000 train steps in every try; 3, 4 and 8 threads per device ran them clean
    (docs/training.md). PJRT_NPROC is read once, when the backend starts: here we can only warn."""
    if len(devices) < 2 or devices[0].platform != "cpu":
        return
    # Unset, the pool has about one thread per core but no fewer than one per device (8 blocked on 2 cores).
    threads = int(os.environ.get("PJRT_NPROC") or os.environ.get("NPROC") or max(os.cpu_count() or 1, len(devices)))
    if threads < CPU_THREADS_PER_DEVICE * len(devices):
        warnings.warn(
            f"{len(devices)} CPU devices share a pool of {threads} XLA threads, which can deadlock in collectives; "
            f"set PJRT_NPROC={CPU_THREADS_PER_DEVICE * len(devices)} (or more) before JAX starts",
            RuntimeWarning, stacklevel=3)


def spec_for_shape(shape: tuple[int, ...], fsdp_size: int) -> P:
    """FSDP rule: shard the largest axis that `fsdp_size` divides; replicate otherwise.

    A rule of the shape alone, so a parameter and its Adam moments get the same sharding.
    """
    if fsdp_size == 1 or not shape:
        return P()
    for axis in np.argsort(shape)[::-1]:
        if shape[axis] % fsdp_size == 0 and shape[axis] >= fsdp_size:
            spec = [None] * len(shape)
            spec[axis] = FSDP
            return P(*spec)
    return P()


def state_shardings(abstract_tree, mesh: jax.sharding.Mesh):
    """NamedShardings for every leaf of an abstract (ShapeDtypeStruct) tree."""
    fsdp_size = mesh.shape[FSDP]
    return jax.tree.map(lambda x: NamedSharding(mesh, spec_for_shape(x.shape, fsdp_size)), abstract_tree)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(local_batch: dict, mesh: jax.sharding.Mesh) -> dict:
    """Assemble this process's rows into global arrays sharded over the batch axes."""
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()
    }
