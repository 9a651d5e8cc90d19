"""What the runners read of the mechanism registry (`sparse_attn.registry`): `--mechanism local,dense` in every
study runner names one preset per layer.

    attention_config("abca_fixed", Context.lm(256))     # -> the config one layer runs
    parse_names("local,dense", num_layers=2)            # -> ("local", "dense")
    mechanism_names(causal=True)                        # every preset the LM can run

A preset's `config(ctx)` reads a `Context` (sequence length, the window it scales with, the task's anchors, the
executor) and returns a module config (anything with `make(model_dim, num_heads, rngs=...)`). Adding a mechanism
registers its record (`sparse_attn/mechanisms/`, or the user's own code); no experiment file lists mechanisms.

Windows scale with the sequence length so the sparse mechanisms stay O(n): the LM takes `seq_len // 4` tokens each
side, the classifier `min(64, seq_len // 4)` (`Context.lm`, `Context.classifier`); ABCA's zones hold at most
`window` tokens.
"""

from __future__ import annotations

import dataclasses

from sparse_attn import registry


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


NEWLINE_ANCHORS = Anchors(anchor_id=ord("\n"), vocab_size=256, boundary_ids=(ord("\n"),))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Context:
    """What a factory may read. window: tokens each side of a local window (and ABCA's zone cap)."""

    seq_len: int
    window: int
    anchors: Anchors = Anchors()
    implementation: str | None = None

    @classmethod
    def lm(cls, seq_len: int, implementation: str | None = None) -> Context:
        """The byte LM's context: a quarter of the sequence each side, zones at newlines."""
        return cls(seq_len=seq_len, window=max(seq_len // 4, 1), anchors=NEWLINE_ANCHORS,
                   implementation=implementation)

    @classmethod
    def classifier(cls, seq_len: int, anchors: Anchors = Anchors()) -> Context:
        """An encoder layer's context: a quarter of the sequence each side, at most 64."""
        return cls(seq_len=seq_len, window=window_for(seq_len), anchors=anchors)


def window_for(n: int) -> int:
    return min(64, max(n // 4, 1))


def mechanism_names(*, causal: bool | None = None, encoder: bool | None = None) -> tuple[str, ...]:
    """Registered preset names; `causal=True` keeps those the LM can run, `encoder=True` those the classifier can."""
    return registry.preset_names(causal=causal, encoder=encoder)


def attention_config(name: str, ctx: Context, *, causal: bool | None = None, **overrides):
    """The config of one layer running the preset `name`, with `overrides` of its fields (`phase="hard"`).
    `causal=True` refuses encoder-only mechanisms (and `causal=False` causal-only ones) naming what is allowed."""
    allowed = mechanism_names(causal=True) if causal else mechanism_names(encoder=True) if causal is False \
        else mechanism_names()
    if name not in allowed:
        raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join(allowed)}")
    config = registry.preset(name)[1].config(ctx)
    if overrides:
        fields = {f.name for f in dataclasses.fields(config)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"{type(config).__name__} ({name!r}) has no field {', '.join(unknown)}; its fields: "
                             f"{', '.join(sorted(fields))}")
        config = dataclasses.replace(config, **overrides)
    return config


def parse_names(spec: str, num_layers: int) -> tuple[str, ...]:
    """`"a,b,c"` -> one name per layer; a single name applies to every layer."""
    names = tuple(s.strip() for s in spec.split(","))
    if any(not s for s in names):
        raise ValueError(f"empty mechanism name in {spec!r}")
    if len(names) == 1:
        return names * num_layers
    if len(names) != num_layers:
        raise ValueError(f"{len(names)} mechanism names ({spec!r}) for {num_layers} layers: give one or {num_layers}")
    return names
