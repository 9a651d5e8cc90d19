"""Executors of label attention's `LabelPattern`: "bucketed" (label buckets with a log-sum-exp merge,
`bucketed.py`), "xla" and "pallas" (the window `Intervals` carrying the label bits: the generic
band gather and the Pallas kernels' in-tile label test), "reference" (the registry's oracle). See docs/labels.md.

`soft.py` holds the soft and straight-through label attention of the training phases (memberships in, not a
pattern: the label module calls it directly).
"""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.labels.bucketed import bucketed_attention
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.labels.pattern import LabelPattern


def bucketed(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: LabelPattern, *, scale: float, **options):
    """The "bucketed" executor (options: those of `bucketed_attention`, e.g. `block`, `reach`)."""
    if pattern.labels is None:
        raise ValueError(
            "implementation 'bucketed' needs the labels the bits pack: build the pattern with "
            "LabelPattern.from_labels(labels, num_labels, base=...), or run 'reference', 'xla' or 'pallas'"
        )
    b = q_BxNxHxD.shape[0]
    vl = None if pattern.valid_len is None else jnp.broadcast_to(jnp.asarray(pattern.valid_len).reshape(-1), (b,))
    out, lse, _ = bucketed_attention(
        q_BxNxHxD,
        k_BxNxGxD,
        v_BxNxGxD,
        pattern.labels,
        num_labels=pattern.num_labels,
        base=pattern.base,
        scale=scale,
        valid_len=vl,
        **options,
    )
    return out, lse


def _via_window(name: str):
    def run(q, k, v, pattern: LabelPattern, *, scale: float, **options):
        if pattern.base.landmark_every:
            raise ValueError(
                f"implementation {name!r} runs a LabelPattern as its window Intervals, which cannot hold landmark "
                "edges (query -> landmark only): use 'bucketed' or 'reference' when landmark_every > 0"
            )
        return registry.lookup(Intervals, name)(q, k, v, pattern.window(), scale=scale, **options)

    run.__name__ = f"label_pattern_{name}"
    return run


registry.register_executor(LabelPattern, "bucketed", bucketed, default_on=("cpu", "gpu", "tpu"))
registry.register_executor(LabelPattern, "xla", _via_window("xla"))
registry.register_executor(LabelPattern, "pallas", _via_window("pallas"))
