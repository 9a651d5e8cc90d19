"""A run's training and validation curves as a PNG in its work directory (every runner leaves one)."""

from __future__ import annotations

import os
from collections.abc import Callable

from sparse_attn.train import read_metrics


def plot_run(workdir: str, *, train: Callable[[dict], float | None], valid: Callable[[dict], float | None],
             ylabel: str, name: str = "loss_curves.png") -> str:
    """`train(record)` / `valid(record)`: the value plotted from each metrics record (None skips the record);
    returns the PNG's path."""
    import matplotlib  # noqa: PLC0415 — only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4))
    for split, value, style in (("train", train, dict(lw=0.8)), ("valid", valid, dict(marker="o"))):
        points = [(step, value(r)) for step, r in read_metrics(workdir, split).items()]
        points = [(s, v) for s, v in points if v is not None]
        ax.plot([s for s, _ in points], [v for _, v in points], label="validation" if split == "valid" else split,
                **style)  # fmt: skip
    ax.set(xlabel="step", ylabel=ylabel, title=os.path.basename(os.path.abspath(workdir)))
    ax.grid(alpha=0.3)
    ax.legend()
    path = os.path.join(workdir, name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
