"""The classification study's experiments as data: each config's docstring gives its command and the result it
reproduces (rows in experiments/results/<task>.jsonl, tables in docs/results.md). `CONFIGS[name](task, n,
attention, seed)` gives one run's `ClassifyConfig`."""

from __future__ import annotations

import dataclasses

from sparse_attn.data.tasks import Dyck
from sparse_attn.models import TransformerConfig
from sparse_attn.studies import warm_start as rws
from sparse_attn.studies.mechanisms import Context, attention_config, parse_names
from sparse_attn.studies.tasks import Task, make_task, task_anchors
from sparse_attn.train import TrainConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifyConfig:
    """One run: task (its config fixes the data), mechanism names per layer, model, training, eval size.

    Evaluation covers the first `num_validation` validation examples (`train.eval_batches` is not used).
    `router_warm_start` > 0 (Dyck, layer 0 a defect-pair router): fit layer 0's router to the bracket matching
    for that many steps before task training (sparse_attn/studies/warm_start.py); rows say `<attention>+warm<steps>`.
    """

    name: str
    task_name: str
    task: Task
    mechanisms: tuple[str, ...]
    model: TransformerConfig
    train: TrainConfig
    num_validation: int
    router_warm_start: int = 0
    router_warm_lr: float = 1e-2

    def __post_init__(self):
        if self.router_warm_start < 0:
            raise ValueError(f"router_warm_start must be >= 0 steps, got {self.router_warm_start}")
        if self.router_warm_start:
            if not isinstance(self.task, Dyck):
                raise ValueError(f"the router warm start needs bracket words (dyck), not {self.task_name}")
            rws.route_layers(self.model)  # layer 0 must be a defect-pair router


def _config(name, task_name, n, attention, *, layers, dim, heads, mlp, num_train, num_validation, **train):
    task = make_task(task_name, n, num_train=num_train, num_validation=num_validation)
    names = parse_names(attention, layers)
    anchors = task_anchors(task)
    model = TransformerConfig(
        vocab_size=task.vocab_size, model_dim=dim, num_heads=heads, num_layers=layers, mlp_dim=mlp,
        num_classes=task.num_classes,
        attention=tuple(attention_config(a, Context.classifier(n, anchors), causal=False) for a in names),
    )
    return ClassifyConfig(name=name, task_name=task_name, task=task, mechanisms=names, model=model,
                          train=TrainConfig(seq_len=n, **train), num_validation=num_validation)


def smoke(task: str = "listops", n: int = 64, attention: str = "dense", seed: int = 0) -> ClassifyConfig:
    """CI: 1 layer x 32 wide, 4 steps of 8 sequences, 16 validation examples; seconds on CPU.

    `python -m experiments.classification --task listops --n 64 --config smoke`. Expected: it runs, checkpoints at
    steps 2 and 4, and writes result.json; the accuracy of 4 steps means nothing.
    """
    return _config("smoke", task, n, attention, layers=1, dim=32, heads=2, mlp=64, num_train=64, num_validation=16,
                   seed=seed, global_batch=8, num_steps=4, learning_rate=1e-3, warmup_steps=1,
                   checkpoint_every=2, eval_every=4, eval_batches=2)


def small(task: str = "digits", n: int = 64, attention: str = "dense", seed: int = 0) -> ClassifyConfig:
    """CPU (2 cores): 2 layers x 64 wide (~0.1M params), 300 steps of 32 sequences, 512 validation examples.

    `python -m experiments.classification --task digits --n 64 --mechanism dense --config small`. Measured on
    digits n=64 (all 359 validation images; 2 CPU cores shared with other jobs, ~40 s wall per run,
    deterministic): validation accuracy 0.485 with dense, 0.632 with local (radius 16) in both layers, one
    seed; a pipeline sample, not a comparison (docs/results.md). Other tasks and lengths: not yet run.
    """
    return _config("small", task, n, attention, layers=2, dim=64, heads=4, mlp=256, num_train=96_000,
                   num_validation=512,
                   seed=seed, global_batch=32, num_steps=300, learning_rate=2e-3, warmup_steps=30,
                   checkpoint_every=100, eval_every=100, eval_batches=16)


def full(task: str = "listops", n: int = 512, attention: str = "dense", seed: int = 0) -> ClassifyConfig:
    """The non-crossing research document's encoder: 6 layers x 256 wide (4 heads of 64, MLP 1024; ~5M params),
    10k steps of 32
    sequences (LRA ListOps scale), 2000 validation examples. One GPU (H100/H200 class).

    `python -m experiments.classification --task listops --n 512 --mechanism dense --config full`; the study's
    cells: `python -m experiments.classification.grid --grid noncrossing`. Not yet run: record wall clock and accuracy
    here (and in docs/results.md) after the first runs.
    """
    return _config("full", task, n, attention, layers=6, dim=256, heads=4, mlp=1024, num_train=96_000,
                   num_validation=2_000, seed=seed, global_batch=32, num_steps=10_000, learning_rate=5e-4,
                   warmup_steps=500, checkpoint_every=1000, eval_every=1000, eval_batches=63)


def cpu(task: str = "listops", n: int = 128, attention: str = "dense", seed: int = 0) -> ClassifyConfig:
    """The CPU grid's cells (docs/results.md): 2 layers x 64 wide (4 heads, MLP 128), 16 sequences a step,
    evaluation every 50 steps on 256 validation examples; the grid sets `--num_steps` per (task, n).

    `python -m experiments.classification.grid --grid cpu --config cpu`; one cell:
    `python -m experiments.classification --task listops --n 128 --mechanism dense --config cpu --num_steps 600`.
    Expected results: the tables of docs/results.md. Measured (2 shared CPU cores, load ~3-10): 0.12-0.19 s a
    step for dense at n = 128, ~15 s of start-up and compilation; dense ListOps n = 128 is at the majority class
    through step 150 and at 0.34 by step 600; local (32 keys each side) reaches the same 0.34 there.
    """
    return _config("cpu", task, n, attention, layers=2, dim=64, heads=4, mlp=128, num_train=96_000,
                   num_validation=256, seed=seed, global_batch=16, num_steps=400, learning_rate=2e-3,
                   warmup_steps=20, checkpoint_every=50, eval_every=50, eval_batches=16)


CONFIGS = {"smoke": smoke, "small": small, "cpu": cpu, "full": full}
