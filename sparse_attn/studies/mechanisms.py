"""The mechanisms an experiment can name, as one registry: `--attention local,dense` in every study runner.

    register_mechanism("strided", lambda ctx: StridedAttentionConfig(stride=ctx.window), encoder=False)
    attention_config("strided", Context.lm(256))          # -> the config one layer runs
    parse_names("local,dense", num_layers=2)            # -> ("local", "dense")

A factory reads a `Context` (sequence length, the window it scales with, the task's anchors, the implementation)
and returns a module config (anything with `make(model_dim, num_heads, rngs=...)`). `causal`: the mechanism can
run in the causal LM; `encoder`: in the bidirectional classifier. Adding a mechanism registers it here (or from
the user's own code); no experiment file lists mechanisms.

Windows scale with the sequence length so the sparse mechanisms stay O(n): the LM takes `seq_len // 4` tokens each
side, the classifier `min(64, seq_len // 4)` (`Context.lm`, `Context.classifier`); ABCA's zones hold at most
`window` tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sparse_attn import modules as m
from sparse_attn.modules.moba import MobaAttentionConfig
from sparse_attn.modules.nsa import NsaAttentionConfig


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


@dataclasses.dataclass(frozen=True)
class Mechanism:
    name: str
    build: Callable[[Context], object]
    causal: bool = True
    encoder: bool = True


_REGISTRY: dict[str, Mechanism] = {}


def register_mechanism(name: str, build: Callable[[Context], object], *, causal: bool = True,
                       encoder: bool = True, replace: bool = False) -> Mechanism:
    """Make `name` available to every runner's `--attention`; `replace=True` overrides an existing entry."""
    if not name or "," in name or name != name.strip():
        raise ValueError(f"mechanism name {name!r}: a non-empty name without commas or surrounding spaces")
    if name in _REGISTRY and not replace:
        raise ValueError(f"mechanism {name!r} is already registered (replace=True overrides it)")
    _REGISTRY[name] = Mechanism(name, build, causal, encoder)
    return _REGISTRY[name]


def unregister_mechanism(name: str) -> None:
    """Remove `name` (a test's or a notebook's own mechanism)."""
    if name not in _REGISTRY:
        raise ValueError(f"mechanism {name!r} is not registered")
    del _REGISTRY[name]


def mechanism_names(*, causal: bool | None = None, encoder: bool | None = None) -> tuple[str, ...]:
    """Registered names in registration order; `causal=True` keeps those the LM can run, `encoder=True` those the
    classifier can."""
    return tuple(m.name for m in _REGISTRY.values()
                 if (causal is None or m.causal == causal) and (encoder is None or m.encoder == encoder))


def attention_config(name: str, ctx: Context, *, causal: bool | None = None, **overrides):
    """The config of one layer running mechanism `name`, with `overrides` of its fields (`phase="hard"`).
    `causal=True` refuses encoder-only mechanisms (and `causal=False` causal-only ones) naming what is allowed."""
    allowed = mechanism_names(causal=True) if causal else mechanism_names(encoder=True) if causal is False \
        else mechanism_names()
    if name not in allowed:
        raise ValueError(f"unknown attention {name!r}; choose from {', '.join(allowed)}")
    config = _REGISTRY[name].build(ctx)
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
        raise ValueError(f"empty attention name in {spec!r}")
    if len(names) == 1:
        return names * num_layers
    if len(names) != num_layers:
        raise ValueError(f"{len(names)} attention names ({spec!r}) for {num_layers} layers: give one or {num_layers}")
    return names


# ---------------------------------------------------------------------------------------------- built-ins

def _abca(ctx: Context):
    """Explicit anchors at the task's anchor token (fixed every `anchors.interval` if it has none)."""
    a, w = ctx.anchors, ctx.window
    if a.anchor_id is not None:
        return m.AnchorAttentionConfig(placement="explicit", anchor_id=a.anchor_id, vocab_size=a.vocab_size,
                                     max_zone=w, implementation=ctx.implementation)
    return m.AnchorAttentionConfig(placement="fixed", interval=min(a.interval or w, w), max_zone=w,
                                 implementation=ctx.implementation)


def _nsa(w: int, implementation) -> NsaAttentionConfig:
    d = max(w // 8, 1)
    return NsaAttentionConfig(compress_block=2 * d, compress_stride=d, select_block=max(w // 4, 1), top_n=3,
                              sink_blocks=0, recent_blocks=0, window=max(w // 2, 1), implementation=implementation)


def _builtins():
    impl = lambda c: c.implementation  # noqa: E731
    reg = register_mechanism
    reg("dense", lambda c: m.DenseAttention(implementation=impl(c)))
    reg("local", lambda c: m.LocalAttention(radius=c.window, implementation=impl(c)))
    reg("longformer", lambda c: m.LongformerAttention(radius=c.window, num_global=1, implementation=impl(c)))
    reg("bigbird", lambda c: m.BigBirdAttention(radius=c.window, num_global=1, num_random=1,
                                              block=min(32, c.seq_len), implementation=impl(c)))
    reg("labels", lambda c: m.LabelAttentionConfig(radius=c.window, block=min(128, c.seq_len),
                                                 soft_block=min(64, c.seq_len)))
    reg("abca", _abca)
    reg("abca_fixed", lambda c: m.AnchorAttentionConfig(placement="fixed", interval=c.window, max_zone=c.window,
                                                      implementation=impl(c)))
    reg("abca_learned", lambda c: m.AnchorAttentionConfig(placement="learned", boundary_ids=c.anchors.boundary_ids,
                                                        max_zone=c.window, implementation=impl(c)))
    # MoBA: blocks of half a window, the own block plus the top-2 earlier ones (the paper's top-3).
    reg("moba", lambda c: MobaAttentionConfig(block_size=max(c.window // 2, 1), top_k=3,
                                              implementation=impl(c)))
    # NSA: compressed tokens every window / 8 (blocks twice that), top-3 selection blocks of a quarter window, and a
    # half window; the budget grids size it from the budget instead (`studies.budget.nsa_for_budget`).
    reg("nsa", lambda c: _nsa(c.window, impl(c)))
    for router in ("defect", "brick", "adjacent"):
        full = {"defect": "defect_pair", "brick": "brick_wall", "adjacent": "adjacent_topk"}[router]
        reg(f"noncrossing_{router}", lambda c, r=full: m.NoncrossingAttentionConfig(router=r), causal=False)


_builtins()
