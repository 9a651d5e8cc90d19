"""The executor registry: (pattern type, implementation name) -> executor, with one contract.

An executor is `fn(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, *, scale, **options) -> (out, lse)`: `out` in q's
dtype, `lse` float32 [B, N, H] (-inf on rows with no allowed key). A pattern type is any class with
`num_tokens`, `validate(batch, heads)` and `to_dense()` (bool [B|1, H|1, N, N]); registering its first executor
also registers "reference" for it (the dense oracle over `to_dense()`), so every pattern type has its oracle.

`implementation=None` is resolved here and nowhere else (`resolve`): per pattern type and platform, to the executor
registered as that platform's default (the fastest measured there), else the first one registered after
"reference". Where the fastest depends on the pattern, a default may be conditional (`register_default(..., when=)`,
a predicate of the pattern's static properties, e.g. an `Intervals` whose reach spans the sequence): the
conditional defaults a pattern satisfies come first, the latest registered first. A mechanism that runs one
executor choice over several pattern types asks for the `counterpart` of its choice on the others.

An executor that sees more than its output (the label executor's per-query key counts and band tier) registers
with `aux=True` and returns `(out, lse, aux)`, `aux` a dict of arrays; `attention(..., return_aux=True)` hands it on
(an empty dict for the others), so a module can read its executor's diagnostics without bypassing the registry.

An executor that applies a score function (`attention(..., score_fn=)`: `score_fn(score, b, h, q_idx, kv_idx)` on
the scaled logits before the softmax) registers with `scores=True` and receives it as `fn(..., score_fn=...)`
("reference" always does); with a score function, `implementation=None` resolves to the platform's default if it
takes one, else to the first registered executor that does.

An executor may also register `prepare(pattern, *, head_dim, **options) -> metadata` (a pytree of arrays built
from the pattern alone: tile lists, token metadata, slot layouts). `sparse_attn.prepare` calls it once, and the
executor then receives the result as `fn(..., prepared=metadata)` instead of rebuilding it (docs/architecture.md,
"Prepared patterns").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

PLATFORMS = ("cpu", "gpu", "tpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


@dataclasses.dataclass
class _Entries:
    fns: dict[str, Callable] = dataclasses.field(default_factory=dict)
    prepares: dict[str, Callable] = dataclasses.field(default_factory=dict)
    defaults: dict[str, str] = dataclasses.field(default_factory=dict)  # platform -> name
    # (platform, name, predicate of the pattern): conditional defaults, tried before `defaults`, newest first
    rules: list[tuple[str, str, Callable]] = dataclasses.field(default_factory=list)
    with_aux: set[str] = dataclasses.field(default_factory=set)  # names returning (out, lse, aux)
    with_scores: set[str] = dataclasses.field(default_factory=lambda: {"reference"})  # names taking score_fn=


_TABLE: dict[type, _Entries] = {}
_REFERENCE: list[Callable] = []  # set once by executors/reference.py


def set_reference(fn: Callable) -> None:
    """The oracle every pattern type gets as "reference" (registered by `executors.reference`)."""
    _REFERENCE[:] = [fn]
    for entries in _TABLE.values():
        entries.fns.setdefault("reference", fn)


def register_executor(
    pattern_type: type,
    name: str,
    fn: Callable,
    *,
    default_on: tuple[str, ...] | str = (),
    prepare: Callable | None = None,
    aux: bool = False,
    scores: bool = False,
) -> None:
    """Registers `fn` as implementation `name` for `pattern_type` (replacing an earlier one of that name).

    Args:
      pattern_type: the pattern class `fn` runs (subclasses inherit it unless they register their own).
      name: the implementation name, e.g. "xla", "pallas", or what a mechanism executor does ("packed").
      fn: `fn(q, k, v, pattern, *, scale, **options) -> (out, lse)`, or `(out, lse, aux)` with `aux=True`.
      default_on: platforms ("cpu", "gpu", "tpu") where `implementation=None` picks it.
      prepare: optional `prepare(pattern, *, head_dim, **options) -> metadata` (a pytree); `fn` must then accept
        `prepared=metadata` (None: build it itself).
      aux: `fn` returns a third value, a dict of diagnostics arrays (`attention(..., return_aux=True)`).
      scores: `fn` takes `score_fn=` (a score function or None) and applies it to the scaled logits before masking.
    """
    if not isinstance(pattern_type, type):
        raise ValueError(f"pattern_type must be a class, got {pattern_type!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"executor name must be a non-empty string, got {name!r}")
    default_on = (default_on,) if isinstance(default_on, str) else tuple(default_on)
    for p in default_on:
        if p not in PLATFORMS:
            raise ValueError(f"default_on platforms must be among {PLATFORMS}, got {p!r}")
    entries = _TABLE.setdefault(pattern_type, _Entries())
    if _REFERENCE:
        entries.fns.setdefault("reference", _REFERENCE[0])
    entries.fns[name] = fn
    entries.prepares.pop(name, None)
    entries.with_aux.discard(name)
    if aux:
        entries.with_aux.add(name)
    if name != "reference":
        entries.with_scores.discard(name)
    if scores:
        entries.with_scores.add(name)
    if prepare is not None:
        if not callable(prepare):
            raise ValueError(f"prepare must be callable or None, got {prepare!r}")
        entries.prepares[name] = prepare
    for p in default_on:
        entries.defaults[p] = name


def register_default(pattern_type: type, name: str, *, on: tuple[str, ...] | str, when: Callable | None = None) -> None:
    """Makes executor `name` what `implementation=None` runs for `pattern_type` on platforms `on`.

    Args:
      pattern_type: a registered pattern type (its "reference" counts as registered once any executor is).
      name: one of its executors.
      on: platforms ("cpu", "gpu", "tpu").
      when: None (the platform's default for every pattern of the type, as `register_executor(default_on=...)`),
        or `when(pattern) -> bool` over the pattern's static properties (shapes and static fields: it runs at trace
        time), making `name` the default only for the patterns it accepts, ahead of the unconditional default.
    """
    on = (on,) if isinstance(on, str) else tuple(on)
    for p in on:
        if p not in PLATFORMS:
            raise ValueError(f"default platforms must be among {PLATFORMS}, got {p!r}")
    if when is not None and not callable(when):
        raise ValueError(f"when must be None or a predicate of the pattern, got {when!r}")
    known = set(_TABLE[pattern_type].fns if pattern_type in _TABLE else ()) | ({"reference"} if _REFERENCE else set())
    if name not in known:
        raise ValueError(f"register executor {name!r} for {pattern_type.__name__} before making it a default")
    entries = _TABLE.setdefault(pattern_type, _Entries())
    if _REFERENCE:
        entries.fns.setdefault("reference", _REFERENCE[0])
    for p in on:
        if when is None:
            entries.defaults[p] = name
        else:
            entries.rules.insert(0, (p, name, when))


def _entries(pattern_type: type) -> _Entries | None:
    for cls in pattern_type.__mro__:
        if cls in _TABLE:
            return _TABLE[cls]
    return None


def implementations(pattern_type: type) -> tuple[str, ...]:
    """Names registered for a pattern type (empty if the type is not registered)."""
    entries = _entries(pattern_type)
    return () if entries is None else tuple(entries.fns)


def default(pattern_type: type, platform: str, pattern=None) -> str:
    """The implementation `None` picks for this pattern type on this platform; with `pattern` (an instance of the
    type), the conditional defaults it satisfies first (`register_default(..., when=)`)."""
    entries = _entries(pattern_type)
    if entries is None:
        raise ValueError(f"no executor is registered for pattern type {pattern_type.__name__}")
    platform = _ALIASES.get(platform, platform)
    if pattern is not None:
        for p, name, when in entries.rules:
            if p == platform and when(pattern):
                return name
    if platform in entries.defaults:
        return entries.defaults[platform]
    if "cpu" in entries.defaults:  # the portable choice
        return entries.defaults["cpu"]
    return next((n for n in entries.fns if n != "reference"), "reference")


def resolve(pattern, implementation: str | None = None, platform: str | None = None, *, scores: bool = False) -> str:
    """The executor name `attention(..., pattern, implementation=...)` runs: `implementation` itself (checked:
    ValueError naming what can run the pattern), or for None this platform's default for the pattern (`default`;
    platform None: JAX's default backend). `scores=True` (a score function is given): an executor that takes one
    (for None: the default if it does, else the first registered that does; an explicit name that does not is
    refused, naming those that do)."""
    if implementation is None:
        name = default(type(pattern), platform or jax.default_backend(), pattern)
        if scores and not takes_scores(type(pattern), name):
            entries = _entries(type(pattern))
            name = next((n for n in entries.fns if n != "reference" and n in entries.with_scores), "reference")
        return name
    lookup(type(pattern), implementation)
    if scores and not takes_scores(type(pattern), implementation):
        able = sorted(_entries(type(pattern)).with_scores & set(_entries(type(pattern)).fns))
        raise ValueError(f"implementation {implementation!r} of {type(pattern).__name__} patterns applies no score "
                         f"function; score_fn runs on {able}")  # fmt: skip
    return implementation


def takes_scores(pattern_type: type, name: str) -> bool:
    """Whether executor `name` applies a score function (`score_fn=`)."""
    lookup(pattern_type, name)
    return name in _entries(pattern_type).with_scores


def counterpart(pattern, implementation: str | None, platform: str | None = None) -> str:
    """The executor of `pattern` that stands in for `implementation`, a mechanism's executor choice made for another
    of its pattern types (ABCA's handshake `NeighbourList` beside its `ZonePattern` stages, NSA's window `Intervals`
    beside its selected `BlockLayout`): the same name where this pattern type registers it ("reference" stays the
    oracle, "xla" the XLA executor), else (and for None) this platform's default for the pattern."""
    if implementation is not None and implementation in implementations(type(pattern)):
        return implementation
    return resolve(pattern, None, platform)


def preparer(pattern_type: type, name: str) -> Callable | None:
    """The `prepare` function registered with executor `name` (None: it builds everything per call)."""
    lookup(pattern_type, name)
    return _entries(pattern_type).prepares.get(name)


def returns_aux(pattern_type: type, name: str) -> bool:
    """Whether executor `name` returns `(out, lse, aux)` rather than `(out, lse)`."""
    lookup(pattern_type, name)
    return name in _entries(pattern_type).with_aux


def lookup(pattern_type: type, name: str) -> Callable:
    """The executor `name` for a pattern type; ValueError naming what can run it otherwise."""
    entries = _entries(pattern_type)
    if entries is None:
        known = sorted(t.__name__ for t in _TABLE)
        raise ValueError(f"pattern must be one of the registered pattern types {known}, got {pattern_type.__name__}")
    if not isinstance(name, str) or name not in entries.fns:
        raise ValueError(
            f"implementation must be None or one of {sorted(entries.fns)}, got {name!r} "
            f"(not an implementation of {pattern_type.__name__} patterns)"
        )
    return entries.fns[name]
