"""Sequence-classification tasks: generated offline (ListOps, Dyck, Pathfinder) or bundled/loaded (digits,
CIFAR-10); long-range retrieval for causal LMs (associative recall, passkey; `retrieval`). Each is a frozen config with `source(split)`; see `common` for the protocol and docs/tasks.md."""

from sparse_attn.data.tasks.cifar10 import Cifar10
from sparse_attn.data.tasks.common import PAD_ID, SPLITS, TaskBatches, batch, batch_indices, eval_batches, patchify
from sparse_attn.data.tasks.digits import Digits
from sparse_attn.data.tasks.dyck import Dyck
from sparse_attn.data.tasks.listops import ListOps
from sparse_attn.data.tasks.pathfinder import Pathfinder
from sparse_attn.data.tasks.retrieval import AssociativeRecall, Passkey

__all__ = [
    "PAD_ID",
    "SPLITS",
    "AssociativeRecall",
    "Cifar10",
    "Digits",
    "Dyck",
    "ListOps",
    "Passkey",
    "Pathfinder",
    "TaskBatches",
    "batch",
    "batch_indices",
    "eval_batches",
    "patchify",
]
