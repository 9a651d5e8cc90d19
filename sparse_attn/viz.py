"""Draw a pattern's dense oracle mask as a PNG (used by every mechanism's docs)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure  # no pyplot: importing this module never changes the user's backend


def plot_mask(mask_NxN, path: str, *, title: str | None = None, extra: dict | None = None) -> str:
    """Saves a boolean [Nq, Nk] mask as an image (allowed pairs dark). Returns the path."""
    mask = np.asarray(mask_NxN, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"plot_mask needs a 2-D mask, got shape {mask.shape}")
    fig = Figure(figsize=(5, 5), dpi=120)
    ax = fig.add_subplot()
    ax.imshow(mask, cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    label = title or ""
    density = mask.mean()
    label += f"\n{int(mask.sum())} pairs, density {density:.3f}"
    for k, v in (extra or {}).items():
        label += f", {k} {v}"
    ax.set_title(label.strip(), fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_pattern(pattern, path: str, *, batch: int = 0, head: int = 0, title: str | None = None) -> str:
    """Draws `pattern.to_dense()` for one sequence and head."""
    dense = np.asarray(pattern.to_dense())
    mask = dense[min(batch, dense.shape[0] - 1), min(head, dense.shape[1] - 1)]
    return plot_mask(mask, path, title=title)
