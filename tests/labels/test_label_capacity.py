"""The hard phase's capacity: an explicit or calibrated planned reach runs the planned band (tier 0) exactly, a
batch that needs more runs a wider exact tier, and every forward reports the tier it ran (`reach_tier`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.executors.labels.bucketed import bucketed_attention, default_reach, fallback_reaches
from sparse_attn.executors.reference import reference_attention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import (
    LabelAttentionConfig,
    LabelCapacity,
    LabelRouterConfig,
    calibrate_reach,
    label_stats,
)
from sparse_attn.modules.labels.calibrate import capacity_for, label_layers
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

TOL = dict(atol=2e-5, rtol=2e-5)  # float32 executor vs float32 dense reference (as test_bucketed_executor.py)
N, DM, HEADS = 64, 16, 2


def test_capacity_for_rounds_up_with_margin_and_stops_at_the_radius():
    assert capacity_for([10, 3], margin=0.0, radius=64) == 16
    assert capacity_for([16], margin=0.0, radius=64) == 16
    assert capacity_for([16], margin=0.25, radius=64) == 24  # 20 -> 24
    assert capacity_for([30], margin=0.25, radius=32) == 32  # 37.5 -> 40, held by the radius
    assert capacity_for([], margin=0.25, radius=32) == 0
    assert capacity_for([0, 0], margin=0.25, radius=32) == 0


@pytest.mark.parametrize("reach", [-1, 2.0, True, "8"])
def test_config_rejects_a_bad_reach(reach):
    with pytest.raises(ValueError, match="reach"):
        LabelCapacity(reach=reach)


def test_executor_reports_the_tier_it_ran():
    b, n, h, dh = 1, 64, 2, 8
    q, kk, v = (jax.random.normal(jax.random.PRNGKey(s), (b, n, h, dh)) for s in range(3))
    base = BaseGraph(radius=20)
    run = jax.jit(bucketed_attention, static_argnames=("num_labels", "base", "block", "reach"))
    collapsed = jnp.zeros((1, 1, n, 1), jnp.int32)  # every range spans 20 entries a side
    assert fallback_reaches(2, 20, n) == (2, 8, 20)
    for reach, tier in ((2, 2), (8, 1), (16, 1), (20, 0), (24, 0)):  # ladders (2, 8, 20), (8, 20), (16, 20)
        _, _, info = run(q, kk, v, collapsed, num_labels=4, base=base, block=8, reach=reach)
        assert int(info["tier"]) == tier, reach
        assert int(info["reach"]) == fallback_reaches(reach, 20, n)[tier]
        assert (int(info["overflow"]) > 0) == (tier > 0)


def test_label_stats_file_the_capacity_figures():
    keys = jnp.ones((1, 1, 8), jnp.int32)
    sizes = jnp.full((1, 1, 4), 2, jnp.int32)
    st = label_stats(keys, keys, sizes, heads=2, head_dim=4, causal=True, overflow=5, needed=30, reach=16, tier=1)
    assert float(st["reach_tier"]) == 1 and float(st["reach_needed"]) == 30 and float(st["reach_planned"]) == 16
    assert float(st["capacity_overflow"]) == 5 and float(st["reach_needed_ratio"]) == pytest.approx(30 / 16)
    st = label_stats(keys, keys, sizes, heads=2, head_dim=4, causal=True)  # outside the hard phase
    assert float(st["reach_tier"]) == 0 and float(st["reach_needed"]) == 0


def _module(router: str, causal: bool, reach=None):
    cfg = LabelAttentionConfig(num_labels=16, top_k=2, radius=40, landmark_every=10, phase="hard", rope_base=None,
                               router=LabelRouterConfig(hidden=8), capacity=LabelCapacity(block=8, reach=reach))
    module = cfg.make(DM, HEADS, rngs=nnx.Rngs(0))
    kernel = module.router.out.kernel[...]
    if router == "collapsed":  # label 0 always wins and label 1 wins the tie among the rest: one label for all
        module.router.out.kernel[...] = jnp.zeros_like(kernel)
        module.router.out.bias[...] = jnp.zeros_like(module.router.out.bias[...]).at[0].set(10.0)
    else:  # balanced: large random logits with no per-label offset, so every label wins about equally often
        module.router.out.kernel[...] = 10.0 * jax.random.normal(jax.random.PRNGKey(7), kernel.shape)
        module.router.out.bias[...] = jnp.zeros_like(module.router.out.bias[...])
    return cfg, module


def _x(seed):
    return jax.random.normal(jax.random.PRNGKey(seed), (1, N, DM))


def _check_against_reference(cfg, module, x, causal):
    """The module's hard forward and input gradient equal the dense reference's; returns its stats."""
    ct = jax.random.normal(jax.random.PRNGKey(4), (1, N, DM))
    vl = jnp.asarray([N])
    base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmark_every, causal=causal)

    def reference_path(module, x):
        q, k, v = module.proj.qkv(x)
        labels = B.top_k_labels(module.router(x), cfg.top_k)
        pattern = LabelPattern(B.pack_labels(labels, cfg.num_labels), vl, base)
        return module.proj.out(reference_attention(q, k, v, pattern, 1 / np.sqrt(q.shape[-1]))[0])

    @nnx.jit
    def run(module, x):
        def loss(x):
            out = module(x, AttentionContext(valid_len=vl, step=jnp.int32(0), causal=causal))
            return jnp.sum(out.y * ct), out

        (_, out), dx = jax.value_and_grad(loss, has_aux=True)(x)
        dx_ref = jax.grad(lambda x: jnp.sum(reference_path(module, x) * ct))(x)
        return out, dx, reference_path(module, x), dx_ref

    out, dx, y_ref, dx_ref = run(module, x)
    np.testing.assert_allclose(np.asarray(out.y), np.asarray(y_ref), **TOL)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(dx_ref), **TOL)
    return out.stats


@pytest.mark.parametrize("router,causal", [("collapsed", True), ("collapsed", False), ("balanced", True)])
def test_calibrated_reach_runs_the_planned_band_exactly(router, causal):
    cfg, module = _module(router, causal)
    x = _x(3)
    default = default_reach(N, BaseGraph(radius=cfg.radius), cfg.num_labels, cfg.top_k)
    st = _check_against_reference(cfg, module, x, causal)
    assert float(st["reach_planned"]) == default == module.planned_reach(N)
    needed = int(st["reach_needed"])
    if router == "collapsed":  # one label for all: the ranges span the window, past the balanced plan
        assert float(st["reach_tier"]) > 0 and needed > default
    params = nnx.state(module, nnx.Param)
    ctx = AttentionContext(valid_len=jnp.asarray([N]), step=jnp.int32(0), causal=causal)
    report = calibrate_reach(module, [x], call=lambda m, x: m(x, ctx), margin=0.25)
    assert list(report.values()) == [dict(before=default, after=capacity_for([needed], margin=0.25, radius=40),
                                          needed=[needed])]
    assert module.reach == capacity_for([needed], margin=0.25, radius=40) and not module.capture_needed
    assert not jax.tree.leaves(nnx.state(module, nnx.Intermediate))  # the needs were captured, not kept
    jax.tree.map(np.testing.assert_array_equal, nnx.state(module, nnx.Param), params)
    st = _check_against_reference(cfg, module, x, causal)  # recompiled at the calibrated reach
    assert float(st["reach_planned"]) == module.reach and float(st["reach_tier"]) == 0
    assert float(st["capacity_overflow"]) == 0 and int(st["reach_needed"]) == needed


def test_a_batch_that_needs_more_than_the_calibration_runs_a_wider_tier_exactly():
    cfg, module = _module("balanced", True)
    ctx = AttentionContext(valid_len=jnp.asarray([N]), step=jnp.int32(0), causal=True)
    calibrate_reach(module, [_x(3), _x(5)], call=lambda m, x: m(x, ctx), margin=0.0)
    assert 0 < module.reach < 40
    _, collapsed = _module("collapsed", True)
    module.router = collapsed.router  # the same layer, now with one label for every token
    st = _check_against_reference(cfg, module, _x(3), True)
    assert float(st["reach_tier"]) > 0 and float(st["capacity_overflow"]) > 0
    assert float(st["reach_needed"]) > module.reach


def test_configured_reach_is_the_planned_band():
    cfg, module = _module("collapsed", True, reach=40)
    st = _check_against_reference(cfg, module, _x(3), True)
    assert float(st["reach_planned"]) == 40 and float(st["reach_tier"]) == 0 and float(st["capacity_overflow"]) == 0
    assert list(label_layers(module)) == [()]
