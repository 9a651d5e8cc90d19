"""Hard-phase capacity from observed batches: each label layer's planned band set to what its batches needed.

The planned reach (tier 0 of the bucketed executor) is static, so setting it recompiles whatever runs the model
next; the result stays exact for any batch (a batch that needs more runs a wider tier and says so in `reach_tier`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import jax
import numpy as np
from flax import nnx

from sparse_attn.modules.labels.module import LabelAttention
from sparse_attn.patterns.labels.schedule import INFERENCE_STEP

ROUND = 8  # reaches are rounded up to a multiple of 8 entries, as `default_reach` does


def label_layers(model: nnx.Module) -> dict[tuple, LabelAttention]:
    """Every `LabelAttention` in `model`, by its path in the module graph."""
    return {path: m for path, m in nnx.iter_modules(model) if isinstance(m, LabelAttention)}


def capacity_for(needed: Iterable[int], *, margin: float, radius: int) -> int:
    """The planned reach for observed needs: (1 + margin) x the largest, rounded up to 8, at most the radius (a
    band of the radius holds any range); at least 0."""
    top = max(needed, default=0)
    reach = -(-math.ceil(top * (1.0 + margin)) // ROUND) * ROUND
    return int(min(max(reach, 0), max(radius, 0)))


def observed_needs(model: nnx.Module, batches: Iterable, *, call: Callable | None = None,
                   step: int = INFERENCE_STEP) -> dict[tuple, list[int]]:
    """The reach each label layer's hard forward needed on each batch (no parameter changes).

    `call(model, batch)` runs the model (default: `model(batch, step=step)`, a token batch; `step` must be in the
    hard phase for the layers to need anything).
    """
    layers = label_layers(model)
    run = call or (lambda m, batch: m(batch, step=step))

    def forward(m, batch):
        run(m, batch)  # only the sown needs are kept

    forward = nnx.jit(nnx.capture(forward, nnx.Intermediate))
    for m in layers.values():
        m.capture_needed = True
    try:
        needs: dict[tuple, list[int]] = {path: [] for path in layers}
        for batch in batches:
            _, sown = forward(model, batch)
            sown = nnx.to_pure_dict(sown)
            for path in layers:
                needs[path].extend(int(v) for v in np.ravel(jax.device_get(_sown(sown, path))))
        return needs
    finally:
        for m in layers.values():
            m.capture_needed = False


def _sown(pure: dict, path: tuple):
    """The `reach_needed` values the layer at `path` sowed (one per call of the layer)."""
    for key in path:
        pure = pure[key]
    return jax.tree.leaves(pure["reach_needed"])


def calibrate_reach(model: nnx.Module, batches: Iterable, *, margin: float = 0.25, call: Callable | None = None,
                    step: int = INFERENCE_STEP) -> dict[tuple, dict]:
    """Sets every label layer's planned reach (`LabelAttention.reach`) from the reach its hard forward needed on
    `batches`: `capacity_for(needs, margin=margin, radius=config.radius)`. Returns per layer path the planned reach
    before (at the batches' length) and after and the needs observed.

    Meant for a trained model before evaluation or inference (its router no longer moves); a train step compiled
    before the call keeps the old reach.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    batches = list(batches)
    layers = label_layers(model)
    n = _length(batches)
    before = {path: m.planned_reach(n) for path, m in layers.items()}
    needs = observed_needs(model, batches, call=call, step=step)
    out = {}
    for path, m in layers.items():
        m.reach = capacity_for(needs[path], margin=margin, radius=m.config.radius)
        out[path] = dict(before=before[path], after=m.reach, needed=needs[path])
    return out


def _length(batches: list) -> int:
    """The sequence length of the batches (their leading array's axis 1)."""
    if not batches:
        raise ValueError("calibrate_reach needs at least one batch")
    leaf = jax.tree.leaves(batches[0])[0]
    return int(np.shape(leaf)[1])
