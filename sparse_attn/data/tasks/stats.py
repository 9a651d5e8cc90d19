"""Generation speed and label statistics of the generated tasks (the numbers in docs/tasks.md).

    python -m sparse_attn.data.tasks.stats --num 500

Speed is examples per CPU-second of this process (`time.process_time`, one core, robust to a busy machine)
and per wall-clock second.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sparse_attn.data.tasks.common import batch
from sparse_attn.data.tasks.dyck import Dyck
from sparse_attn.data.tasks.listops import ListOps
from sparse_attn.data.tasks.pathfinder import BACKGROUND, Pathfinder


def timed_batch(task, num: int) -> tuple[dict, float, float]:
    src = task.source("train")
    src[0]  # warm caches (Dyck's tables)
    t0, w0 = time.process_time(), time.perf_counter()
    out = batch(src, range(num))
    return out, num / (time.process_time() - t0), num / (time.perf_counter() - w0)


def best_threshold_accuracy(x: np.ndarray, label: np.ndarray) -> float:
    """Accuracy of the best one-feature threshold rule (either direction): a shortcut's strength."""
    best = 0.0
    for th in np.unique(x):
        acc = np.mean((x <= th) == label)
        best = max(best, acc, 1 - acc)
    return float(best)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=500)
    args = ap.parse_args(argv)
    n = args.num
    print("| task | examples/CPU-s | examples/s wall | statistics |")
    print("| --- | --- | --- | --- |")
    for task in (ListOps(seq_len=128), ListOps(seq_len=512), ListOps(seq_len=2048), ListOps.lra()):
        out, cpu, wall = timed_batch(task, n)
        share = np.bincount(out["label"], minlength=10) / n
        print(f"| ListOps seq_len={task.seq_len} band={task.length_band} | {cpu:.0f} | {wall:.0f} | "
              f"mean length {out['valid_len'].mean():.0f}, majority class {share.max():.1%} "
              f"(label {share.argmax()}), median depth {np.median(out['depth']):.0f} |")
    for task in (Dyck(seq_len=128), Dyck(seq_len=512), Dyck(seq_len=2048)):
        out, cpu, wall = timed_batch(task, n)
        q = np.percentile(out["distance"], [10, 50, 90, 100]).astype(int).tolist()
        print(f"| Dyck-({task.k},{task.m}) seq_len={task.seq_len} | {cpu:.0f} | {wall:.0f} | "
              f"balanced {out['label'].mean():.1%}, distance p10/p50/p90/max {q} |")
    for task in (Pathfinder(size=32), Pathfinder(size=64)):
        out, cpu, wall = timed_batch(task, n)
        label = out["label"] == 1
        ink = (out["inputs"] != BACKGROUND).sum(1)
        print(f"| Pathfinder {task.size}x{task.size} {task.lengths} | {cpu:.0f} | {wall:.0f} | "
              f"connected {label.mean():.1%}, ink pixels pos/neg {ink[label].mean():.1f}/{ink[~label].mean():.1f}, "
              f"dot-distance threshold accuracy {best_threshold_accuracy(out['dot_distance'], label):.1%}, "
              f"ink threshold accuracy {best_threshold_accuracy(ink, label):.1%} |")


if __name__ == "__main__":
    main()
