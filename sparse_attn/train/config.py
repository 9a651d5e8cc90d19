"""The training configuration shared by experiments (optimizer, mesh, checkpoints, logging)."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything the shared loop needs; experiments nest it in their own frozen config."""

    seed: int = 0
    global_batch: int = 32
    seq_len: int = 128
    num_steps: int = 1000

    # Optimizer: AdamW, linear warmup then cosine decay to `end_lr_fraction * learning_rate`.
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    end_lr_fraction: float = 0.1
    weight_decay: float = 0.1  # applied to parameters with >= 2 axes only
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0

    # Mesh: ("data", "fsdp"). `mesh_data=-1` takes the remaining devices; `num_devices=None` all.
    mesh_data: int = -1
    mesh_fsdp: int = 1
    num_devices: int | None = None

    # Checkpoints (orbax): every K steps and at exit; keep the latest N (+ every M-th step if set).
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    keep_period: int | None = None
    async_checkpoints: bool = True

    # Evaluation and reporting.
    eval_every: int = 200
    eval_batches: int = 8
    # Host sync period: the CPU runtime deadlocks with too many steps in flight (seen on jax 0.10, CPU).
    sync_every: int = 8
    progress: bool = True
    tensorboard: bool = False

    def __post_init__(self):
        for name, low, high in (("learning_rate", 0.0, None), ("end_lr_fraction", 0.0, None), ("weight_decay", 0.0, None),
                                ("b1", 0.0, 1.0), ("b2", 0.0, 1.0), ("grad_clip", 0.0, None)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    value < low or (high is not None and value >= high):
                span = f">= {low:g}" + ("" if high is None else f" and < {high:g}")
                raise ValueError(f"TrainConfig.{name} must be a finite number {span}, got {value!r}")
        if not 1 <= self.sync_every <= 16:
            raise ValueError(f"sync_every must be in [1, 16] (CPU in-flight limit), got {self.sync_every}")
        for name in ("global_batch", "seq_len", "checkpoint_every", "eval_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {self.num_steps}")
