"""Sequence-classification tasks: generated offline (ListOps, Dyck, Pathfinder) or bundled/loaded (digits,
CIFAR-10). Each is a frozen config with `source(split)`; see `common` for the protocol and docs/tasks.md."""

from sparse_attn.data.tasks.cifar10 import Cifar10
from sparse_attn.data.tasks.common import PAD_ID, SPLITS, TaskBatches, batch, batch_indices, eval_batches, patchify
from sparse_attn.data.tasks.digits import Digits
from sparse_attn.data.tasks.dyck import Dyck
from sparse_attn.data.tasks.listops import ListOps
from sparse_attn.data.tasks.pathfinder import Pathfinder

__all__ = [
    "PAD_ID",
    "SPLITS",
    "Cifar10",
    "Digits",
    "Dyck",
    "ListOps",
    "Pathfinder",
    "TaskBatches",
    "batch",
    "batch_indices",
    "eval_batches",
    "patchify",
]
