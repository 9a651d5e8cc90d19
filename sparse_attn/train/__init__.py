"""Shared training machinery: mesh, sharded init, pure NNX steps, orbax checkpoints, reporting."""

from sparse_attn.train.checkpoint import CheckpointRestoreError, CheckpointSaveError, CorruptCheckpointError
from sparse_attn.train.config import TrainConfig
from sparse_attn.train.interrupt import Terminated
from sparse_attn.train.loop import NonFiniteLossError, train_and_evaluate
from sparse_attn.train.reporting import read_metrics
from sparse_attn.train.run_config import ConfigMismatchError
from sparse_attn.train.workdir_lock import WorkdirLockedError

__all__ = [
    "CheckpointRestoreError", "CheckpointSaveError", "ConfigMismatchError", "CorruptCheckpointError",
    "NonFiniteLossError", "Terminated", "TrainConfig", "WorkdirLockedError", "read_metrics", "train_and_evaluate",
]
