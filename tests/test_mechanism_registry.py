"""The mechanism registry: one record per mechanism, one config per preset name, clear refusals."""

import dataclasses

import jax
import pytest

from sparse_attn import registry
from sparse_attn.mechanisms.common import NEWLINE
from sparse_attn.studies.mechanisms import NEWLINE_ANCHORS, Context
from sparse_attn.studies.bench import BenchSpec
from sparse_attn.studies.budget import budget_names


def _fields(config) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@pytest.mark.parametrize("name", registry.preset_names(budget=True))
def test_a_preset_name_builds_one_config_in_the_runners_and_the_grids(name):
    """At the byte LM's context with window = the tuned size, the runner's config and the grid's agree on every
    field but those the preset declares sized by (size, n, keys target)."""
    _, preset = registry.preset(name)
    n, size, target = 256, 16, 24.0
    runner = preset.config(Context(seq_len=n, window=size, anchors=NEWLINE_ANCHORS))
    grid = preset.budget(size, n, target)
    assert type(runner) is type(grid)
    differ = {k for k, v in _fields(runner).items() if _fields(grid)[k] != v}
    assert differ <= set(preset.sized), (name, differ)


def test_every_config_and_module_has_one_record():
    records = registry.mechanisms()
    configs = [c for m in records for c in m.configs]
    assert len(configs) == len(set(configs))
    for m in records:
        for name, preset in m.presets.items():
            cfg = preset.config(Context.lm(64))
            assert registry.for_config(cfg) is m, name
    assert {"dense", "local", "labels", "labels_d8k2", "abca", "abca_fixed", "moba", "nsa",
            "noncrossing_defect"} <= set(registry.preset_names())
    assert budget_names()[0] == "dense" and "labels" not in budget_names()  # the runner's 32-label default


def test_registration_refuses_clashes_and_non_records():
    fixed = registry.mechanism("fixed")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_mechanism(fixed)
    clash = dataclasses.replace(fixed, name="copy", configs=())
    with pytest.raises(ValueError, match="preset 'bigbird' of 'copy' is already 'fixed''s"):
        registry.register_mechanism(clash)
    with pytest.raises(TypeError, match="Mechanism record"):
        registry.register_mechanism("fixed")
    with pytest.raises(ValueError, match="unknown mechanism 'nope'; choose from dense, local"):
        registry.preset("nope")
    with pytest.raises(ValueError, match="no mechanism is registered for int"):
        registry.for_config(3)
    assert "copy" not in [m.name for m in registry.mechanisms()]


def test_newline_presets_anchor_at_newlines():
    cfg = registry.preset("abca_hs2")[1].budget(32, 256, 24.0)
    assert cfg.handshake_steps == 2 and NEWLINE == ord("\n")


@pytest.mark.parametrize("name", sorted(registry.bench_cores()))
def test_every_benchmark_core_keeps_the_contract(name):
    """fn(q, k, v, *extra) -> (out [B, N, H, D], pairs): pairs from the fn exactly when no fixed pattern gives them;
    what forward+backward differentiates is a float argument (traced shapes only: nothing compiles)."""
    record = next(m for m in registry.mechanisms() if name in m.bench)
    causal = any(p.causal for p in record.presets.values())
    spec = BenchSpec(n=256, batch=2, heads=2, head_dim=8, dtype="float32", radius=8, impl=None,
                     key=jax.random.key(0), causal=causal)
    core = registry.bench_cores()[name](spec)
    assert isinstance(core, registry.BenchCore)
    out, pairs = jax.eval_shape(core.fn, *core.args)
    assert out.shape == (2, 256, 2, 8)
    assert (pairs is None) == (core.pattern is not None), name
    for i in core.grad_argnums:
        leaves = jax.tree.leaves(core.args[i])
        assert leaves and all(jax.numpy.issubdtype(x.dtype, jax.numpy.floating) for x in leaves), (name, i)
