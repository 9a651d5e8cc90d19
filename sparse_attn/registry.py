"""The mechanism registry: one record per mechanism, from which modules, decoders, probes, budget grids, runners and
benchmarks read what they need to know about it (docs/architecture.md, "Adding a mechanism").

    register_mechanism(Mechanism(name="strided", configs=(StridedConfig,), module=StridedAttention,
                                 presets={"strided": Preset(config=lambda ctx: StridedConfig(stride=ctx.window))}))
    preset("strided")                 # -> (the Mechanism, its Preset)
    preset_names(causal=True)         # what `--mechanism` accepts in the LM runner
    for_config(cfg).module            # the NNX module class a config builds
    for_module(layer).decoder         # a layer's incremental decoder

A *mechanism* is a kind of attention (ABCA, label attention, MoBA, ...); its *presets* are the named configs the
runners and the budget grids build (`abca_fixed`, `labels_d8k2`, ...). A preset name means one config everywhere:
`Preset.config` gives it at a runner's context, `Preset.budget` at the size a budget grid tunes, and the two agree
on every field but the ones the size sets (`Preset.sized`; tests/test_mechanism_registry.py).

The built-in records live in `sparse_attn/mechanisms/`, registered when `sparse_attn` is imported. This module imports
nothing of the package, so every layer can read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple


class BenchCore(NamedTuple):
    """One timed cell of a mechanism, for the attention benchmark and the GPU check.

    fn(*args) -> (out [B, N, H, D], pairs), with args = (q, k, v, *extra): what the core reads besides q, k, v
      (zones, a router's input and parameters) is passed as arguments, as in a model, so XLA cannot fold it into
      constants. `pairs`: the allowed (query, key) pairs per sequence and head (their mean where they differ) where
      a router learns the pattern, None where `pattern` gives them.
    pattern: the pattern attended when the args fix it (FLOPs, pair counts); None when a router learns it.
    grad_argnums: what forward+backward differentiates (q, k, v; + the router's input where it learns).
    """

    fn: Callable[..., tuple[Any, Any]]
    args: tuple
    pattern: Any = None
    grad_argnums: tuple[int, ...] = (0, 1, 2)


class Decoder(NamedTuple):
    """Incremental decoding of one layer (docs/generation.md).

    init_cache(module, batch, max_len, dtype) -> cache: a pytree of static shapes for at most `max_len` tokens.
    step(module, x_Bx1xD, cache, ctx) -> (y_Bx1xD, cache): `y` is what the full forward pass gives at `ctx.pos`.
    """

    init_cache: Callable[..., Any]
    step: Callable[..., tuple[Any, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset:
    """One named config of a mechanism.

    config(ctx) -> the layer config at a runner's context (`sparse_attn.studies.mechanisms.Context`: sequence length,
      the window it scales with, the task's anchors, the executor).
    budget(size, n, keys_target) -> the config a budget grid runs at the tuned integer `size` (None: not matched;
      the grids' reference, dense, has none). `tuned` names what `size` sets; `monotone`: keys per query grow with
      it (bisection), else every size is measured.
    sized: the config fields `budget` derives from (size, n, keys_target); every other field equals `config`'s at a
      context whose window is `size`.
    causal / encoder: it runs in the causal LM / in the bidirectional classifier.
    """

    config: Callable[[Any], Any]
    budget: Callable[[int, int, float], Any] | None = None
    tuned: str = ""
    monotone: bool = True
    sized: tuple[str, ...] = ()
    causal: bool = True
    encoder: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mechanism:
    """Everything the library and the experiments know about one mechanism.

    configs: its config classes (`config.make(model_dim, num_heads, rngs=...)` builds `module(config, ...)`).
    module: its NNX module class; layers are matched to records by it (or a base class).
    presets: the names runners and grids build, unique across mechanisms.
    decoder: its incremental decoder (None: generation refuses models that hold it).
    probe: `(module, x_BxNxD, ctx) -> (q, k, pattern, implementation)`, the single-softmax pattern a layer attends,
      for the retrieval diagnostics (None: no probe).
    keys_per_query(config, n, tokens_BxN) -> float: allowed keys per query of one causal layer on full length-n
      sequences, how the budget grids match budgets (None: no preset of it is budget-matched).
    bench: benchmark cores by name, `spec -> BenchCore` (`sparse_attn.studies.bench.BenchSpec`: length, batch,
      heads, head dim, dtype, radius, causal, executor), timed by `experiments.benchmarks.attention` and
      `experiments.gpu.check`.
    """

    name: str
    configs: tuple[type, ...]
    module: type
    presets: Mapping[str, Preset]
    decoder: Decoder | None = None
    probe: Callable[..., tuple] | None = None
    keys_per_query: Callable[..., float] | None = None
    bench: Mapping[str, Callable[[Any], BenchCore]] = dataclasses.field(default_factory=dict)


_MECHANISMS: dict[str, Mechanism] = {}


def register_mechanism(mechanism: Mechanism, *, replace: bool = False) -> Mechanism:
    """Adds `mechanism` (replace=True overrides a record of the same name). Preset and benchmark names must be new."""
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"register_mechanism takes a Mechanism record, got {type(mechanism).__name__}")
    for name in (mechanism.name, *mechanism.presets, *mechanism.bench):
        if not name or "," in name or name != name.strip():
            raise ValueError(f"name {name!r}: a non-empty name without commas or surrounding spaces")
    if mechanism.name in _MECHANISMS and not replace:
        raise ValueError(f"mechanism {mechanism.name!r} is already registered (replace=True overrides it)")
    others = [m for m in _MECHANISMS.values() if m.name != mechanism.name]
    for kind, names in (("preset", mechanism.presets), ("benchmark core", mechanism.bench)):
        taken = {n: m.name for m in others for n in (m.presets if kind == "preset" else m.bench)}
        clash = sorted(set(names) & set(taken))
        if clash:
            raise ValueError(f"{kind} {clash[0]!r} of {mechanism.name!r} is already {taken[clash[0]]!r}'s")
    _MECHANISMS[mechanism.name] = mechanism
    return mechanism


def unregister_mechanism(name: str) -> None:
    """Removes `name` (a test's or a notebook's own mechanism)."""
    if name not in _MECHANISMS:
        raise ValueError(f"mechanism {name!r} is not registered")
    del _MECHANISMS[name]


def mechanisms() -> tuple[Mechanism, ...]:
    """Every record, in registration order."""
    return tuple(_MECHANISMS.values())


def mechanism(name: str) -> Mechanism:
    if name not in _MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; registered: {', '.join(_MECHANISMS)}")
    return _MECHANISMS[name]


def preset_names(*, causal: bool | None = None, encoder: bool | None = None, budget: bool | None = None
                 ) -> tuple[str, ...]:
    """Preset names in registration order; `causal=True` keeps those the LM can run, `encoder=True` those the
    classifier can, `budget=True` those the budget grids can match."""
    return tuple(name for m in _MECHANISMS.values() for name, p in m.presets.items()
                 if (causal is None or p.causal == causal) and (encoder is None or p.encoder == encoder)
                 and (budget is None or (p.budget is not None) == budget))


def preset(name: str) -> tuple[Mechanism, Preset]:
    """(the mechanism, the preset) named `name`."""
    for m in _MECHANISMS.values():
        if name in m.presets:
            return m, m.presets[name]
    raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join(preset_names())}")


def for_config(config) -> Mechanism:
    """The record whose `configs` hold `config`'s class."""
    for m in _MECHANISMS.values():
        if type(config) in m.configs:
            return m
    raise ValueError(f"no mechanism is registered for {type(config).__name__} "
                     "(sparse_attn.registry.register_mechanism adds one)")


def for_module(module) -> Mechanism | None:
    """The record of `module`'s class or its nearest registered base class (None if none)."""
    for cls in type(module).__mro__:
        for m in _MECHANISMS.values():
            if m.module is cls:
                return m
    return None


def bench_cores() -> dict[str, Callable[[Any], BenchCore]]:
    """Every registered benchmark core by name."""
    return {name: core for m in _MECHANISMS.values() for name, core in m.bench.items()}
