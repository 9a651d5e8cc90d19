"""`--attention` names shared by the experiments: the per-layer list parser and the encoder mechanisms.

`parse_names("local,dense", num_layers=2)` gives one name per layer (one name means every layer).
`classifier_attention(name, n=..., anchors=...)` builds the bidirectional mechanism a classification layer
runs; the causal LM keeps its own table (`experiments/lm.py`), since routing attention is encoder-only.

Windows and zones scale with the sequence length up to a cap, so the sparse mechanisms stay O(n):
`window = min(64, max(n // 4, 1))` tokens each side (local, Longformer, BigBird, labels) and ABCA zones
of at most `window` tokens.
"""

from __future__ import annotations

import dataclasses

from sparse_attn.modules import (
    AnchorAttentionConfig,
    BigBirdAttention,
    DenseAttention,
    LabelAttentionConfig,
    LocalAttention,
    LongformerAttention,
    NoncrossingAttentionConfig,
)


def parse_names(spec: str, num_layers: int) -> tuple[str, ...]:
    """`"a,b,c"` -> one name per layer; a single name applies to every layer."""
    names = tuple(s.strip() for s in spec.split(","))
    if any(not s for s in names):
        raise ValueError(f"empty attention name in {spec!r}")
    if len(names) == 1:
        return names * num_layers
    if len(names) != num_layers:
        raise ValueError(f"{len(names)} attention names ({spec!r}) for {num_layers} layers: give one or {num_layers}")
    return names


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anchors:
    """What ABCA's `abca` (explicit) and `abca_learned` read from a task's tokens.

    anchor_id: explicit anchors where `tokens == anchor_id` (None: the task has no anchor token, so `abca`
      places anchors every `interval` tokens, e.g. at image row starts).
    boundary_ids: the learned placement's BCE target tokens.
    """

    anchor_id: int | None = None
    interval: int | None = None
    boundary_ids: tuple[int, ...] = ()
    vocab_size: int | None = None


CLASSIFIER_NAMES = (
    "dense", "local", "longformer", "bigbird",
    "abca", "abca_fixed", "abca_learned", "labels",
    "noncrossing_defect", "noncrossing_brick", "noncrossing_adjacent",
)


def window_for(n: int) -> int:
    return min(64, max(n // 4, 1))


def classifier_attention(name: str, *, n: int, anchors: Anchors = Anchors()):
    """The attention config of one encoder layer for sequence length `n`.

    abca: explicit anchors at `anchors.anchor_id` (fixed every `anchors.interval` if the task has none);
    abca_fixed: every `window` tokens; abca_learned: a score head trained towards `anchors.boundary_ids`.
    routing_*: non-crossing routing with the defect-pair router, the fixed brick wall, or adjacent top-k.
    Executors: `implementation=None` (the platform's best) everywhere.
    """
    w = window_for(n)
    explicit = (
        AnchorAttentionConfig(placement="explicit", anchor_id=anchors.anchor_id, vocab_size=anchors.vocab_size,
                              max_zone=w)
        if anchors.anchor_id is not None
        else AnchorAttentionConfig(placement="fixed", interval=min(anchors.interval or w, w), max_zone=w)
    )
    table = {
        "dense": lambda: DenseAttention(),
        "local": lambda: LocalAttention(radius=w),
        "longformer": lambda: LongformerAttention(radius=w, num_global=1),
        "bigbird": lambda: BigBirdAttention(radius=w, num_global=1, num_random=1, block=min(32, n)),
        "abca": lambda: explicit,
        "abca_fixed": lambda: AnchorAttentionConfig(placement="fixed", interval=w, max_zone=w),
        "abca_learned": lambda: AnchorAttentionConfig(placement="learned", boundary_ids=anchors.boundary_ids,
                                                      max_zone=w),
        "labels": lambda: LabelAttentionConfig(radius=w, block=min(128, n), soft_block=min(64, n)),
        "noncrossing_defect": lambda: NoncrossingAttentionConfig(router="defect_pair"),
        "noncrossing_brick": lambda: NoncrossingAttentionConfig(router="brick_wall"),
        "noncrossing_adjacent": lambda: NoncrossingAttentionConfig(router="adjacent_topk"),
    }
    assert tuple(table) == CLASSIFIER_NAMES
    if name not in table:
        raise ValueError(f"unknown attention {name!r}; choose from {', '.join(CLASSIFIER_NAMES)}")
    return table[name]()
