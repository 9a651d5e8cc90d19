"""The run's configuration as JSON, stored with every checkpoint and compared on resume.

A resume that silently changes the model, the data or the schedule trains something other than
what the workdir says. So each checkpoint carries `record(...)` (every config field, dataclass
types included), and a resume refuses a record that differs except in fields that cannot change
the trajectory (`ALWAYS_ALLOWED`) or that the caller names (`allowed`, fnmatch patterns over
dotted paths such as `train.num_steps` or `model.attention*.implementation`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from typing import Any

# Logging, checkpointing and layout only: the losses do not depend on them (the device count
# changes float reductions within the tolerance tests/train/test_device_count.py fixes).
ALWAYS_ALLOWED = (
    "train.eval_every", "train.sync_every", "train.progress", "train.tensorboard",
    "train.checkpoint_every", "train.keep_checkpoints", "train.keep_period", "train.async_checkpoints",
    "train.mesh_data", "train.mesh_fsdp", "train.num_devices",
)


class ConfigMismatchError(ValueError):
    """Resuming a checkpoint written with a different configuration."""


def to_json(obj) -> Any:
    """Dataclasses (with their type name under `_type`), sequences, dicts and scalars as JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"_type": type(obj).__name__, **{f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return repr(obj)  # anything else is compared by its repr


def record(train_config, experiment: dict | None = None) -> dict:
    """`{"train": ..., **experiment}` as JSON; `experiment` names the model, data, etc."""
    return {"train": to_json(train_config), **to_json(experiment or {})}


def flatten(tree, prefix: str = "") -> dict[str, Any]:
    """Dotted paths to leaves: `{"model.attention.0.radius": 32, ...}`."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = ((str(i), v) for i, v in enumerate(tree))
    else:
        return {prefix: tree}
    out = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
    return out


_MISSING = "<absent>"


def differences(stored: dict, current: dict) -> dict[str, tuple[Any, Any]]:
    """`{path: (stored value, current value)}` for every path whose value differs."""
    a, b = flatten(stored), flatten(current)
    return {k: (a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(a.keys() | b.keys())
            if a.get(k, _MISSING) != b.get(k, _MISSING)}


def _allowed(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) or path.startswith(p + ".") for p in patterns)


def check_resume(stored: dict, current: dict, allowed: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Raise `ConfigMismatchError` naming every differing field not allowed; return the allowed ones."""
    allowed = (*ALWAYS_ALLOWED, *allowed)
    diffs = differences(stored, current)
    refused = {k: v for k, v in diffs.items() if not _allowed(k, allowed)}
    if refused:
        lines = "\n".join(f"  {k}: checkpoint {old!r} != now {new!r}" for k, (old, new) in refused.items())
        raise ConfigMismatchError(
            f"the checkpoint was written with a different configuration:\n{lines}\n"
            "Use the original settings, a fresh workdir, or accept the change explicitly "
            f"(allowed_changes / --allow_change {' '.join(sorted(refused))})."
        )
    return diffs
