"""Shared training machinery: mesh, sharded init, pure NNX steps, orbax checkpoints, reporting."""

from sparse_attn.train.config import TrainConfig
from sparse_attn.train.loop import NonFiniteLossError, train_and_evaluate
from sparse_attn.train.reporting import read_metrics

__all__ = ["NonFiniteLossError", "TrainConfig", "read_metrics", "train_and_evaluate"]
