"""The frozen config of ABCA attention; `make(model_dim, num_heads, rngs=...)` builds the NNX module.

One place per decision: where anchors go is one sub-config, `placement`, whose type is the placement mode and
whose fields are that mode's only (`FixedAnchors`, `ExplicitAnchors`, `LearnedAnchors`); the top level holds what
every mode shares (zone cap, handshake, executor, heads, pooled writes). Each sub-config validates its own values.
The flat fields of earlier versions (`placement="fixed"`, `interval=`, `anchor_id=`, ...) are refused with the form
to use instead (`MOVED`, one table); `flat_fields()` still gives every setting under its flat name, for the result
rows that record them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import ClassVar

from flax import nnx

from sparse_attn.modules.abca.core import check_options
from sparse_attn.modules.base import build_module, check_floats, refuse_old_fields
from sparse_attn.patterns import common


def _check_finite(owner: str, name: str, value, *, low: float = -math.inf) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= low
    if not ok:
        bound = "" if low == -math.inf else f" >= {low:g}"
        raise ValueError(f"{owner}.{name} must be a finite number{bound}, got {value!r}")


def _check_bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


# ---------------------------------------------------------------------------------------------- placements


@dataclasses.dataclass(frozen=True, kw_only=True)
class FixedAnchors:
    """An anchor every `interval` positions (0, interval, 2 interval, ...); the default placement."""

    kind: ClassVar[str] = "fixed"

    interval: int = 64

    def __post_init__(self):
        common.static_int("FixedAnchors.interval", self.interval, low=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExplicitAnchors:
    """Anchors where `ctx.tokens == anchor_id` (anchor tokens in a vocabulary of `vocab_size`, checked when both are
    given), or an `anchor_mask` passed to the call (`anchor_id=None`: the mask only; the decoder needs an id)."""

    kind: ClassVar[str] = "explicit"

    anchor_id: int | None = None
    vocab_size: int | None = None

    def __post_init__(self):
        common.static_int("ExplicitAnchors.anchor_id", self.anchor_id, low=0, none_ok=True)
        common.static_int("ExplicitAnchors.vocab_size", self.vocab_size, low=1, none_ok=True)
        if self.anchor_id is not None and self.vocab_size is not None and self.anchor_id >= self.vocab_size:
            raise ValueError(f"ExplicitAnchors.anchor_id {self.anchor_id} lies outside the vocabulary "
                             f"[0, {self.vocab_size})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnedAnchors:
    """A score head on the layer input places the anchors (anchor iff score > 0).

    boundary_ids: the BCE target of the placement loss: positions whose token is one of these (empty: no loss).
    loss_weight: that loss's weight in `aux_losses`.
    straight_through: the score head also gets gradients from the task loss through the anchor decisions (ST
      estimator). On by default: without `boundary_ids` it is the head's only training signal (docs/abca.md,
      "Placement and the zone cap", measured on a toy task).
    score_bias_init: the head's initial bias (negative: few anchors before training; the zone cap inserts the rest).
    """

    kind: ClassVar[str] = "learned"

    boundary_ids: tuple[int, ...] = ()
    loss_weight: float = 0.1
    straight_through: bool = True
    score_bias_init: float = -2.0

    def __post_init__(self):
        if isinstance(self.boundary_ids, (str, bytes)) or not isinstance(self.boundary_ids, (tuple, list)):
            raise ValueError(f"LearnedAnchors.boundary_ids must be a tuple of token ids, got {self.boundary_ids!r}")
        for token in self.boundary_ids:
            common.static_int("LearnedAnchors.boundary_ids[...]", token, low=0)
        object.__setattr__(self, "boundary_ids", tuple(int(t) for t in self.boundary_ids))
        _check_finite("LearnedAnchors", "loss_weight", self.loss_weight, low=0.0)
        _check_bool("LearnedAnchors", "straight_through", self.straight_through)
        _check_finite("LearnedAnchors", "score_bias_init", self.score_bias_init)


PLACEMENTS = {cls.kind: cls for cls in (FixedAnchors, ExplicitAnchors, LearnedAnchors)}  # kind -> sub-config
Placement = FixedAnchors | ExplicitAnchors | LearnedAnchors

# The flat fields of earlier versions -> (the placement that holds it now, its field there): one table for the
# refusals and for `flat_fields`. (`placement="fixed"` etc., the old strings, name `PLACEMENTS`' classes.)
MOVED = {
    "interval": (FixedAnchors, "interval"),
    "anchor_id": (ExplicitAnchors, "anchor_id"),
    "vocab_size": (ExplicitAnchors, "vocab_size"),
    "boundary_ids": (LearnedAnchors, "boundary_ids"),
    "placement_loss_weight": (LearnedAnchors, "loss_weight"),
    "straight_through": (LearnedAnchors, "straight_through"),
    "score_bias_init": (LearnedAnchors, "score_bias_init"),
}


def _spelled(cls) -> str:
    return f"{cls.__name__}({', '.join(f'{f.name}=...' for f in dataclasses.fields(cls))})"


def instead_of(name: str) -> str | None:
    """What to write instead of the old flat field `name` (None: not an old field)."""
    if name not in MOVED:
        return None
    cls, field = MOVED[name]
    return f"placement={cls.__name__}({field}=...)"


# ---------------------------------------------------------------------------------------------- the config


@refuse_old_fields(instead_of)
@dataclasses.dataclass(frozen=True, kw_only=True)
class AnchorAttentionConfig:
    """ABCA (docs/abca.md) for one layer.

    Attributes:
      placement: where anchors go, one of `FixedAnchors(interval=64)` (the default), `ExplicitAnchors(anchor_id,
        vocab_size)` or `LearnedAnchors(boundary_ids=(), loss_weight=0.1, straight_through=True,
        score_bias_init=-2.0)`; `placement.kind` names the mode ("fixed", "explicit", "learned").
      max_zone: static zone cap; fallback anchors are inserted where anchors lie further apart.
      handshake: "chain" (prev/self/next anchor) or "global" (all anchors, first `max_anchors`).
      handshake_steps: handshake passes before zone attention (>= 1).
      max_anchors: the global handshake's dense head (anchors past it keep the chain, reported as overflow), and
        the handshake page of the "packed" core (default 4 ceil(n / max_zone)); more anchors take more pages (exact).
      implementation: the executor of the `patterns.abca.ZonePattern` stages (1 and 3): None (the registry's
        default, "packed"), "packed" (anchor gather key-major, zones in slots), "xla" or "pallas" (the stages as
        Intervals through the block-gather XLA executor or the Pallas kernels), or "reference" (dense oracle).
        Outside "packed" the handshake's `NeighbourList` runs the registry's counterpart of it
        (`executors.registry.counterpart`: "xla" and "reference" themselves, the neighbour lists' default for
        "pallas"); no second field, since nothing else is chosen.
      slot_width: queries per slot of the packed executor (default max_zone).
      num_kv_heads: KV heads (grouped-query attention; default num_heads). Anchor states stay per query head; an
        anchor's zone key/value for a group re-projects its heads' states.
      summaries_per_anchor: P, pooled writes (docs/abca.md, "Pooled writes"): 1 = one state per anchor (the
        research document's); P > 1 adds P - 1 summaries, each gathering with its own query map and read by zone
        queries as one more key per anchor. The incremental decoder and the diagnostics run every P.
    """

    mechanism: ClassVar[str] = "abca"

    placement: Placement = FixedAnchors()
    max_zone: int = 128
    handshake: str = "chain"
    handshake_steps: int = 1
    max_anchors: int | None = None
    implementation: str | None = None
    slot_width: int | None = None
    rope_base: float | None = 10_000.0
    num_kv_heads: int | None = None
    summaries_per_anchor: int = 1

    def __post_init__(self):
        check_floats(self)
        if isinstance(self.placement, str) and self.placement in PLACEMENTS:
            raise TypeError(f"AnchorAttentionConfig.placement={self.placement!r} is the old string form: use "
                            f"placement={_spelled(PLACEMENTS[self.placement])}")
        if not isinstance(self.placement, tuple(PLACEMENTS.values())):
            raise TypeError(f"AnchorAttentionConfig.placement must be one of "
                            f"{', '.join(_spelled(c) for c in PLACEMENTS.values())}, got {self.placement!r}")
        if self.summaries_per_anchor < 1:
            raise ValueError(f"summaries_per_anchor must be >= 1, got {self.summaries_per_anchor}")
        check_options(
            max_zone=self.max_zone,
            handshake=self.handshake,
            handshake_steps=self.handshake_steps,
            max_anchors=self.max_anchors,
            implementation=self.implementation,
            slot_width=self.slot_width,
        )

    def __getattr__(self, name: str):
        # Only called for names the instance does not have: an old flat field says where it went.
        instead = instead_of(name)
        if instead:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}: use {instead}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def flat_fields(self) -> dict:
        """Every setting under its flat name, as before the placement sub-configs: `placement` as its kind
        ("fixed", ...), and each old placement field (`MOVED`) with this placement's value, or the value the flat
        config held for another mode's field (its sub-config's default: `interval` 64 under explicit placement).
        What result rows record (the same keys and values as rows of the flat config)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        flat["placement"] = self.placement.kind
        for old, (cls, field) in MOVED.items():
            flat[old] = getattr(self.placement if isinstance(self.placement, cls) else cls(), field)
        return flat

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """The `AnchorAttention` layer (registered by its mechanism record)."""
        return build_module(self, model_dim, num_heads, rngs=rngs)
