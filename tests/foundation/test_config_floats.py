"""Every float field of every mechanism's config (nested ones included) and of TrainConfig refuses NaN and
infinity with a ValueError naming it, instead of turning logits or updates NaN later."""

import dataclasses
import math

import pytest

from sparse_attn import registry
from sparse_attn.studies.mechanisms import Context
from sparse_attn.train import TrainConfig


def _float_fields(config, seen):
    """(config, field name) for every float field reachable from `config`, one per (class, field)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and (type(config), field.name) not in seen:
            seen.add((type(config), field.name))
            yield config, field.name
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _float_fields(value, seen)


def _cases():
    seen = set()
    configs = [p.config(Context.lm(64)) for m in registry.mechanisms() for p in m.presets.values()]
    return [case for cfg in [*configs, TrainConfig()] for case in _float_fields(cfg, seen)]


CASES = _cases()


@pytest.mark.parametrize("config,name", CASES, ids=[f"{type(c).__name__}.{n}" for c, n in CASES])
def test_a_non_finite_float_field_is_refused_naming_it(config, name):
    assert len(CASES) > 15  # rope_base of every mechanism, thresholds, temperatures, the optimizer
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(config, **{name: bad})
