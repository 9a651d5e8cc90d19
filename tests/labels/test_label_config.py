"""LabelAttentionConfig's groups (schedule, router, capacity): the flat fields of earlier versions refused with the
name to use instead, each group's own checks, the schedule's fractions stating whole steps exactly, the flat view
result rows record, and stored configs (run_config.to_json) restoring nested groups."""

import dataclasses
import math

import numpy as np
import pytest

from sparse_attn.modules.labels import LabelAttentionConfig, LabelCapacity, LabelRouterConfig, LabelSchedule
from sparse_attn.modules.labels.config import GROUPS, MOVED, REMOVED
from sparse_attn.patterns.labels import schedule
from sparse_attn.train import run_config

OLD_FIELDS = {  # every flat field of the config before the grouping that is not at the top level any more
    "num_steps", "soft_frac", "ramp_frac", "straight_through_frac", "anneal_frac", "soft_steps", "ramp_steps",
    "straight_through_steps", "anneal_steps", "tau_start", "tau_end", "router_hidden", "per_head_labels",
    "membership", "freeze_router_when_hard", "router_input_gradient", "sparsity_weight", "balance",
    "balance_weight", "z_loss_weight", "block", "reach", "reach_factor", "soft_block",
}


def test_every_old_field_is_refused_in_one_line_naming_the_new_one():
    assert set(MOVED) | set(REMOVED) == OLD_FIELDS
    cfg = LabelAttentionConfig()
    for old in sorted(OLD_FIELDS):
        with pytest.raises(TypeError, match=f"^LabelAttentionConfig has no field '{old}': use ") as err:
            LabelAttentionConfig(**{old: 1})
        message = str(err.value)
        assert "\n" not in message
        if old in MOVED:
            group, field = MOVED[old]
            assert f"{group}={GROUPS[group].__name__}({field}=...)" in message
            assert field in {f.name for f in dataclasses.fields(GROUPS[group])}
        else:
            assert "schedule=LabelSchedule(num_steps=N" in message
        with pytest.raises(TypeError, match=f"no field '{old}'"):  # `replace` goes through the same check
            dataclasses.replace(cfg, **{old: 1})
        with pytest.raises(AttributeError, match=f"no field '{old}': use "):  # reading one says where it went
            getattr(cfg, old)
        assert not hasattr(cfg, old)
    assert str(pytest.raises(TypeError, LabelAttentionConfig, soft_frac=0.3).value) == (
        "LabelAttentionConfig has no field 'soft_frac': use schedule=LabelSchedule(soft=...)")
    with pytest.raises(TypeError, match="unexpected keyword argument 'nosuch'"):
        LabelAttentionConfig(nosuch=1)


@pytest.mark.parametrize("group, field, value, match", [
    (LabelSchedule, "soft", math.nan, "LabelSchedule.soft must be a finite number >= 0 and <= 1"),
    (LabelSchedule, "anneal", 1.5, "LabelSchedule.anneal"),
    (LabelSchedule, "ramp", -0.1, "LabelSchedule.ramp"),
    (LabelSchedule, "num_steps", 0, "LabelSchedule.num_steps must be None or an int >= 1"),
    (LabelSchedule, "num_steps", 2.0, "LabelSchedule.num_steps"),
    (LabelSchedule, "tau_start", math.inf, "LabelSchedule.tau_start must be a finite number > 0"),
    (LabelSchedule, "tau_end", 0.0, "LabelSchedule.tau_end"),
    (LabelRouterConfig, "hidden", 0, "LabelRouterConfig.hidden must be an int >= 1"),
    (LabelRouterConfig, "per_head", 1, "LabelRouterConfig.per_head must be True or False"),
    (LabelRouterConfig, "input_gradient", None, "LabelRouterConfig.input_gradient"),
    (LabelRouterConfig, "membership", "softmax", "LabelRouterConfig.membership must be one of"),
    (LabelRouterConfig, "balance", "l2", "LabelRouterConfig.balance must be one of"),
    (LabelRouterConfig, "sparsity_weight", -1e-3, "LabelRouterConfig.sparsity_weight must be a finite number >= 0"),
    (LabelRouterConfig, "z_loss_weight", math.nan, "LabelRouterConfig.z_loss_weight"),
    (LabelCapacity, "block", 0, "LabelCapacity.block must be an int >= 1"),
    (LabelCapacity, "soft_block", 8.0, "LabelCapacity.soft_block"),
    (LabelCapacity, "reach", -1, "LabelCapacity.reach must be None or an int >= 0"),
    (LabelCapacity, "reach", True, "LabelCapacity.reach"),
    (LabelCapacity, "reach_factor", 0.0, "LabelCapacity.reach_factor must be a finite number > 0"),
    (LabelCapacity, "reach_factor", math.inf, "LabelCapacity.reach_factor"),
])  # fmt: skip
def test_groups_check_their_own_values(group, field, value, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        group(**{field: value})


def test_the_config_checks_its_own_fields_and_takes_only_its_groups():
    with pytest.raises(ValueError, match="exceed 1"):
        LabelSchedule(soft=0.6, ramp=0.3, straight_through=0.2)
    with pytest.raises(ValueError, match="LabelAttentionConfig.eps"):
        LabelAttentionConfig(eps=math.nan)
    with pytest.raises(ValueError, match="LabelAttentionConfig.radius"):
        LabelAttentionConfig(radius=-1)
    with pytest.raises(ValueError, match="LabelAttentionConfig.phase"):
        LabelAttentionConfig(phase="warm")
    with pytest.raises(TypeError, match="LabelAttentionConfig.schedule must be a LabelSchedule"):
        LabelAttentionConfig(schedule={"soft": 0.3})
    with pytest.raises(TypeError, match="LabelAttentionConfig.capacity must be a LabelCapacity"):
        LabelAttentionConfig(capacity=LabelRouterConfig())
    hash(LabelAttentionConfig())  # static under jit: hashable, groups included


def test_fractions_of_a_fixed_run_state_whole_steps_exactly():
    """round((s / N) * N) == s for every 0 <= s <= N: a phase length in steps is stated as the fraction s / N of
    `num_steps=N` (what the absolute `soft_steps=` ... of earlier versions fixed)."""
    for big in (2_000, 100_000, 10**9):  # every s <= N up to 2000, and the edges of larger runs
        ns = np.arange(1, big + 1) if big == 2_000 else np.asarray([big])
        for n in ns:
            s = np.arange(n + 1) if big == 2_000 else np.asarray([0, 1, 2, 3, n // 3, n // 2, n - 1, n])
            assert np.all(np.abs((s / n) * n - s) < 0.25), n
    # The uses of the absolute form: the notebook's 90-step run and test_label_module's 60 steps.
    nb = LabelSchedule(num_steps=90, soft=40 / 90, ramp=0.0, straight_through=20 / 90, anneal=40 / 90)
    assert nb.phase_steps() == schedule.Schedule(soft=40, ramp=0, straight_through=20, anneal=40)
    assert nb.phase_steps(5000) == nb.phase_steps()  # the schedule's own num_steps wins over a run's
    free = LabelSchedule()
    assert free.phase_steps(1000) == schedule.Schedule(soft=300, ramp=200, straight_through=300, anneal=300)
    assert free.phase_steps() == free.phase_steps(schedule.DEFAULT_NUM_STEPS)


def test_flat_fields_give_every_setting_under_its_flat_name():
    cfg = LabelAttentionConfig(num_labels=8, radius=9, router=LabelRouterConfig(input_gradient=False, hidden=16),
                               capacity=LabelCapacity(block=32, reach=8), schedule=LabelSchedule(soft=0.1))
    flat = cfg.flat_fields()
    assert set(flat) == (OLD_FIELDS - set(REMOVED)) | {f.name for f in dataclasses.fields(cfg)} - set(GROUPS)
    assert (flat["router_input_gradient"], flat["router_hidden"], flat["block"], flat["reach"], flat["soft_frac"],
            flat["phase"], flat["radius"], flat["num_labels"]) == (False, 16, 32, 8, 0.1, "schedule", 9, 8)


def test_stored_configs_restore_nested_groups():
    from sparse_attn.studies.restore import from_json

    cfg = LabelAttentionConfig(num_labels=8, top_k=1, position_cell=4, radius=6,
                               schedule=LabelSchedule(num_steps=90, soft=40 / 90, ramp=0.0, tau_end=0.05),
                               router=LabelRouterConfig(per_head=True, balance="switch", input_gradient=False),
                               capacity=LabelCapacity(block=16, reach=24))
    stored = run_config.to_json({"model": {"attention": [cfg, LabelAttentionConfig()]}})
    assert stored["model"]["attention"][0]["schedule"]["_type"] == "LabelSchedule"
    assert from_json(stored["model"]["attention"][0]) == cfg
    assert from_json(stored)["model"]["attention"] == (cfg, LabelAttentionConfig())
    # The resume check names a changed field by its path in the group.
    other = run_config.to_json({"model": {"attention": [dataclasses.replace(cfg, router=LabelRouterConfig())]}})
    diffs = run_config.differences({"model": {"attention": [stored["model"]["attention"][0]]}}, other)
    assert "model.attention.0.router.input_gradient" in diffs and "model.attention.0.router.per_head" in diffs
