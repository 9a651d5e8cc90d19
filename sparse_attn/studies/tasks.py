"""The classification tasks by name, sized by sequence length, with what the mechanisms read from them (ABCA's
anchors) and how their accuracy is bucketed (ListOps depth, Dyck distance)."""

from __future__ import annotations

import math

from sparse_attn.data.tasks import Cifar10, Digits, Dyck, ListOps, Pathfinder
from sparse_attn.data.tasks import listops as listops_lib
from sparse_attn.data.tasks.padded import PaddedPathfinder, padded_size
from sparse_attn.studies import classification as cm
from sparse_attn.studies.mechanisms import Anchors

TASKS = ("listops", "dyck", "pathfinder", "digits", "cifar10")
Task = ListOps | Dyck | Pathfinder | Digits | Cifar10


def make_task(name: str, n: int, *, num_train: int, num_validation: int) -> Task:
    """The task config for sequence length `n` (generated tasks hold `num_train` / `num_validation` examples)."""
    sizes = dict(num_train=num_train, num_validation=num_validation)
    if name == "listops":
        return ListOps(seq_len=n, **sizes)
    if name == "dyck":
        return Dyck(seq_len=n, **sizes)
    if name == "pathfinder":
        size = math.isqrt(n)
        if size * size != n and n & (n - 1) == 0 and n >= 64:  # n = 128, 512: 11x11, 22x22 padded
            return PaddedPathfinder(size=padded_size(n), pad_to=n, **sizes)
        if size * size != n:
            raise ValueError(f"pathfinder needs n = size**2 (1024, 4096, ...) or a power of two "
                             f"(the largest square image, padded), got {n}")
        return Pathfinder(size=size, **sizes)
    if name == "digits":
        if n != 64:
            raise ValueError(f"digits images are 8x8: n must be 64, got {n}")
        return Digits()
    if name == "cifar10":
        if n not in (1024, 3072):
            raise ValueError(f"cifar10 has n = 1024 (grayscale) or 3072 (RGB), got {n}")
        return Cifar10(grayscale=n == 1024)
    raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")


def task_anchors(task: Task) -> Anchors:
    """ABCA anchors per task. ListOps: `]` (a zone ends with each sub-expression). Dyck: the closers of
    bracket type 0 (the module takes one anchor id, so ~1/(2k) of the tokens; the learned placement
    targets every closer). Images: row starts (every `width` pixels)."""
    if isinstance(task, ListOps):
        return Anchors(anchor_id=listops_lib.CLOSE, boundary_ids=(listops_lib.CLOSE,), vocab_size=task.vocab_size)
    if isinstance(task, Dyck):
        closers = tuple(range(1 + task.k, 1 + 2 * task.k))
        return Anchors(anchor_id=closers[0], boundary_ids=closers, vocab_size=task.vocab_size)
    return Anchors(interval=task.size if isinstance(task, Pathfinder) else task.width)


def task_buckets(task: Task) -> cm.Buckets | None:
    if isinstance(task, ListOps):
        return cm.listops_buckets()
    if isinstance(task, Dyck):
        return cm.dyck_buckets(task.seq_len, task.min_distance)
    return None
