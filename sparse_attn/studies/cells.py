"""What the LM-type studies (language modelling, retrieval) share: a model scale, grid cells, result rows.

A cell is one (n, mechanism, budget, seed) run; its row is one JSON line in `experiments/results/*.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import NamedTuple

from sparse_attn.models import TransformerConfig
from sparse_attn.train import TrainConfig, read_metrics


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scale:
    """Model and schedule of one grid config (the attention is filled in per cell)."""

    layers: int
    dim: int
    heads: int
    mlp: int
    batch: int
    steps: int
    lr: float
    warmup: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int


def model_and_train(scale: Scale, n: int, attention, seed: int) -> tuple[TransformerConfig, TrainConfig]:
    model = TransformerConfig(vocab_size=256, model_dim=scale.dim, num_heads=scale.heads, num_layers=scale.layers,
                              mlp_dim=scale.mlp, attention=attention)
    train = TrainConfig(seed=seed, global_batch=scale.batch, seq_len=n, num_steps=scale.steps, learning_rate=scale.lr,
                        warmup_steps=scale.warmup, weight_decay=0.1, grad_clip=1.0,
                        checkpoint_every=scale.checkpoint_every, keep_checkpoints=1, eval_every=scale.eval_every,
                        eval_batches=scale.eval_batches)
    return model, train


class Cell(NamedTuple):
    n: int
    mechanism: str
    budget: float
    seed: int


def grid_cells(ns, mechanisms, budget, seeds) -> list[Cell]:
    """Every (n, mechanism, seed) at one budget."""
    return [Cell(n, v, budget, s) for n in ns for v in mechanisms for s in seeds]


def peak_mib(mem: dict) -> float | None:
    if not mem:
        return None
    return mem.get("argument_mib", 0) + mem.get("output_mib", 0) - mem.get("alias_mib", 0) + mem.get("temp_mib", 0)


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def stats_curve(workdir: str, max_points: int = 20) -> list[dict]:
    """Every layer's statistics (`layer{i}/...` train metrics) at up to `max_points` logged steps."""
    train = read_metrics(workdir, "train") if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else {}
    steps = sorted(train)
    if not steps:
        return []
    pick = sorted({steps[round(i * (len(steps) - 1) / max(max_points - 1, 1))] for i in range(max_points)})
    return [{"step": s, **{k: finite(v) for k, v in train[s].items() if k.startswith("layer")}} for s in pick]


def read_rows(path: str) -> list[dict]:
    """The JSON objects of `path`, one a line; unreadable lines and a missing file give nothing."""
    rows = []
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def row_key(row: dict) -> tuple:
    return row.get("config"), row.get("n"), row.get("mechanism"), row.get("budget_keys_per_query"), row.get("seed")
