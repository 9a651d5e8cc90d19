"""Executors of label attention's `LabelPattern`: "bucketed" (label buckets with a log-sum-exp merge,
`bucketed.py`), "xla" and "pallas" (the window `Intervals` carrying the label bits: the generic
band gather and the Pallas kernels' in-tile label test), "reference" (the registry's oracle). See docs/labels.md.
`pallas.py` runs the buckets through the Pallas kernels in bucket-entry space ("bucketed_pallas", registered by
`sparse_attn.executors` on import).

`soft.py` holds the soft and straight-through label attention of the training phases (memberships in, not a
pattern: the label module calls it directly).
"""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.labels.bucketed import bucket_layouts, bucketed_attention
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.labels.pattern import LabelPattern


def check_labels(pattern: LabelPattern, implementation: str = "bucketed") -> None:
    """The bucket executors read the labels themselves, not only their bits."""
    if pattern.labels is None:
        raise ValueError(
            f"implementation {implementation!r} needs the labels the bits pack: build the pattern with "
            "LabelPattern.from_labels(labels, num_labels, base=...), or run 'reference', 'xla' or 'pallas'"
        )


def prepare_bucketed(pattern: LabelPattern, *, head_dim=None, **options):
    """The bucket layouts (`bucket_layouts`, leaves [B|1, P, ...]) of a prepared pattern; no option changes them."""
    check_labels(pattern)
    lab = pattern.labels
    vl = jnp.full((1,), pattern.num_tokens, jnp.int32) if pattern.valid_len is None else pattern.valid_len
    vl = jnp.asarray(vl, jnp.int32).reshape(-1)
    b = max(lab.shape[0], vl.shape[0])
    lab = jnp.broadcast_to(lab, (b,) + lab.shape[1:])
    return bucket_layouts(lab, pattern.num_labels, pattern.base, jnp.broadcast_to(vl, (b,)))


def bucketed(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: LabelPattern, *, scale: float, prepared=None, **options):
    """The "bucketed" executor (options: those of `bucketed_attention`, e.g. `block`, `reach`); `prepared`:
    `prepare_bucketed`'s layouts (None: built per call). Returns (out, lse, aux): aux is `bucketed_attention`'s
    info (`keys` int32[B, P, N] each query's allowed keys, `overflow`, `needed`)."""
    check_labels(pattern)
    b = q_BxNxHxD.shape[0]
    vl = None if pattern.valid_len is None else jnp.broadcast_to(jnp.asarray(pattern.valid_len).reshape(-1), (b,))
    return bucketed_attention(
        q_BxNxHxD,
        k_BxNxGxD,
        v_BxNxGxD,
        pattern.labels,
        num_labels=pattern.num_labels,
        base=pattern.base,
        scale=scale,
        valid_len=vl,
        layout=prepared,
        **options,
    )


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


registry.register_executor(
    LabelPattern, "bucketed", bucketed, default_on=("cpu", "gpu", "tpu"), prepare=prepare_bucketed, aux=True
)
registry.register_executor(LabelPattern, "xla", _via_window("xla"), scores=True)
registry.register_executor(LabelPattern, "pallas", _via_window("pallas"), scores=True)
