"""Orbax checkpoints: train state, data-iterator state and the run's config saved together.

Layout: `<workdir>/checkpoints/<step>/{state,data,config,digest}`. Orbax writes a save into
`<step>.orbax-checkpoint-tmp*` and renames it when complete, so a crash mid-save leaves the
previous step restorable. Async saves must be finished before exit: use the manager as a
context manager (its `close()` waits).

Failures are made loud and prompt: directories are created synchronously (an async mkdir that
fails leaves orbax threads waiting 300 s for a signal, so the process hangs at exit), the rest of
a background save is checked with `raise_if_save_failed` every step, and an unreadable checkpoint
is moved to `<workdir>/checkpoints_unreadable/` once an older one restores. Silent corruption is caught on read: each
step saves a digest of its arrays (`digest`), and a restored state that does not match it, or holds a non-finite
value, is treated like an unreadable step (`verify`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from sparse_attn.train.config import TrainConfig
from sparse_attn.train.run_config import ConfigMismatchError

STATE, DATA, CONFIG, DIGEST = "state", "data", "config", "digest"
UNREADABLE_DIR = "checkpoints_unreadable"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the run stopped."""


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the workdir could be read back."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint's arrays read back, but not as they were saved (a digest mismatch) or not finite."""


def _words(x: jax.Array) -> jax.Array:
    """The array's bits as uint32 words, one per element (narrower dtypes zero-extended)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32).reshape(-1)
    bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32).reshape(-1)


@jax.jit
def _sums(leaves):
    """Per array (sum of its words, sum of word * (index + 1)), both mod 2^32: order-independent integer sums, so
    any sharding gives the same digest; a flipped bit always changes the first."""
    out = []
    for x in leaves:
        w = _words(x)
        out.append(jnp.stack([jnp.sum(w, dtype=jnp.uint32),
                              jnp.sum(w * (jnp.arange(w.shape[0], dtype=jnp.uint32) + 1), dtype=jnp.uint32)]))
    return out


@jax.jit
def _all_finite(leaves) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def digest(state) -> dict[str, list[int]]:
    """{array path: [word sum, weighted word sum]} of a state: one integer pass over its arrays on their devices
    (reading every byte once, as the save itself does; compiled once per state structure) and 8 bytes to the host
    per array."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(state)[0], strict=True)
    sums = jax.device_get(_sums(list(leaves)))
    return {jax.tree_util.keystr(p): [int(a) for a in s] for p, s in zip(paths, sums, strict=True)}


def verify(manager: ocp.CheckpointManager, step: int, state) -> None:
    """CorruptCheckpointError unless `state` (restored from `step`) matches the digest saved with it, for every
    array it holds, and is finite. A step written before digests were saved is checked for finiteness only."""
    stored = None
    if os.path.isdir(os.path.join(str(manager.directory), str(step), DIGEST)):
        stored = manager.restore(step, args=ocp.args.Composite(**{DIGEST: ocp.args.JsonRestore()}))[DIGEST]
    if stored is not None:
        got = digest(state)
        bad = sorted(path for path, sums in got.items() if stored.get(path, sums) != sums)
        if bad:
            raise CorruptCheckpointError(f"step {step}: {len(bad)} arrays differ from the digest saved with them "
                                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
    if floats and not bool(_all_finite(floats)):
        raise CorruptCheckpointError(f"step {step}: the restored state holds non-finite values")


def make_manager(workdir: str | os.PathLike, config: TrainConfig) -> ocp.CheckpointManager:
    """Keep the latest `keep_checkpoints` steps, plus every `keep_period`-th step if set."""
    policies = [ocp.checkpoint_managers.LatestN(config.keep_checkpoints)]
    if config.keep_period:
        policies.append(ocp.checkpoint_managers.EveryNSteps(config.keep_period))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
        enable_async_checkpointing=config.async_checkpoints,
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False),  # see module docstring
        create=True,
    )
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    return ocp.CheckpointManager(directory, options=options, item_names=(STATE, DATA, CONFIG, DIGEST))


@contextlib.contextmanager
def opened(workdir: str | os.PathLike, config: TrainConfig):
    """`make_manager` closed on every exit path; a failed pending save raises `CheckpointSaveError`.

    When the body already raised, that error is the one reported: a close that fails too (the
    same failed save) is not allowed to replace it.
    """
    manager = make_manager(workdir, config)
    try:
        yield manager
    except BaseException:
        with contextlib.suppress(Exception):
            manager.close()
        raise
    finish_saves(manager)
    manager.close()


def finish_saves(manager: ocp.CheckpointManager) -> None:
    """Wait for pending saves; raise `CheckpointSaveError` if one failed."""
    try:
        manager.wait_until_finished()
    except Exception as e:
        raise CheckpointSaveError(f"a background save to {manager.directory} failed: {e!r}") from e


def save(manager: ocp.CheckpointManager, step: int, state, data_state: dict, config: dict | None = None) -> None:
    """Start saving `state` (a pytree of jax arrays), its `digest`, `data_state` and `config` (JSON dicts) at
    `step`."""
    items = {STATE: ocp.args.StandardSave(state), DATA: ocp.args.JsonSave(data_state),
             DIGEST: ocp.args.JsonSave(digest(state))}
    if config is not None:
        items[CONFIG] = ocp.args.JsonSave(config)
    try:
        # force: the loop decides when to save; no save-interval policy here
        manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:
        raise CheckpointSaveError(f"saving step {step} to {manager.directory} failed: {e!r}") from e


def raise_if_save_failed(manager: ocp.CheckpointManager) -> None:
    """Raise a finished background save's error now, not at the next save or at exit.

    (`manager.check_for_errors()` misses errors of orbax's finalize thread; a finished
    `wait_until_finished` returns at once or re-raises them.)
    """
    if not manager.is_saving_in_progress():
        finish_saves(manager)


def has_config(manager: ocp.CheckpointManager, step: int) -> bool:
    return os.path.isdir(os.path.join(str(manager.directory), str(step), CONFIG))


def read_config(manager: ocp.CheckpointManager, step: int) -> dict | None:
    """The run config stored at `step`, or None for checkpoints written before configs were stored."""
    if not has_config(manager, step):
        return None
    return manager.restore(step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))[CONFIG]


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


def restore_newest_readable(manager: ocp.CheckpointManager, target, *,
                            check_config: Callable[[int, dict | None], None], log: Callable[[str], None]):
    """Restore the newest checkpoint that reads back: `(step, state, data_state)`, or None if none exist.

    `check_config(step, stored_config)` runs before the arrays are read; its errors propagate (a
    config mismatch is not corruption). A step that stores no config is checked against the newest other step's;
    if no step stores one, the resume is refused (ConfigMismatchError): nothing says the checkpoint is this run's. A checkpoint that fails to read (truncated JSON, tensorstore
    errors, missing files) is named, skipped, and moved aside once an older one restores; if
    none restores, nothing is moved and the newest one's error is raised.
    """
    unreadable: list[tuple[int, Exception]] = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            stored = read_config(manager, step)
        except Exception as e:  # noqa: BLE001 — any read failure makes this step unusable
            unreadable.append((step, e))
            log(f"checkpoint step {step} in {manager.directory} is unreadable ({_brief(e)}); trying the previous one")
            continue
        if stored is None:
            stored = _config_of_run(manager, step, log)
        check_config(step, stored)
        try:
            state, data_state = restore(manager, target, step)
            verify(manager, step, state)
        except Exception as e:  # noqa: BLE001 — any read failure makes this step unusable
            unreadable.append((step, e))
            log(f"checkpoint step {step} in {manager.directory} is unreadable ({_brief(e)}); trying the previous one")
            continue
        for bad, _ in unreadable:
            _move_aside(manager, bad, log)
        return step, state, data_state
    if unreadable:
        step, error = unreadable[0]
        raise CheckpointRestoreError(f"no checkpoint in {manager.directory} could be read; the newest, step "
                                     f"{step}, failed with {_brief(error)}") from error
    return None


def _config_of_run(manager: ocp.CheckpointManager, step: int, log: Callable[[str], None]) -> dict:
    """The newest readable config of the run's other steps, for a step that stores none."""
    for other in sorted(manager.all_steps(), reverse=True):
        if other == step:
            continue
        try:
            stored = read_config(manager, other)
        except Exception:  # noqa: BLE001 — an unreadable config is no witness
            continue
        if stored is not None:
            log(f"checkpoint step {step} stores no config; checked against step {other}'s")
            return stored
    raise ConfigMismatchError(f"checkpoint step {step} in {manager.directory} stores no run config and no other step "
                              "does: nothing says it is this run's. Use another workdir, or move the checkpoints "
                              "away to start afresh")


def _brief(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:500]}"


def _move_aside(manager: ocp.CheckpointManager, step: int, log: Callable[[str], None]) -> None:
    """Keep an unreadable step for inspection, out of orbax's way (the run will save that step again)."""
    src = os.path.join(str(manager.directory), str(step))
    dst = os.path.join(os.path.dirname(str(manager.directory)), UNREADABLE_DIR, str(step))
    if jax.process_index() == 0:
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.move(src, dst)
        log(f"moved unreadable checkpoint step {step} to {dst}")
    manager.reload()
