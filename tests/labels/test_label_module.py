"""LabelAttention (NNX): phases follow the step, router gradients, causality through gradients, the ramp's smooth
transition, the schedule scaled to the run, losses, stats."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import label_oracles as oracles
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models.transformer import TransformerConfig, TransformerLM
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import (
    INFERENCE_STEP,
    LabelAttentionConfig,
    LabelCapacity,
    LabelRouterConfig,
    LabelSchedule,
    label_stats,
)
from sparse_attn.modules.labels.module import DEFAULT_NUM_STEPS
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels import losses, schedule

N, DM, HEADS = 32, 16, 2
# 40 steps: soft 0-9, ramp 10-19, straight-through 20-29, hard from 30.
CFG = LabelAttentionConfig(
    num_labels=6, top_k=2, radius=5, landmark_every=8, rope_base=None,
    schedule=LabelSchedule(num_steps=40, soft=0.25, ramp=0.25, straight_through=0.25, anneal=0.25),
    router=LabelRouterConfig(hidden=8, z_loss_weight=1e-3), capacity=LabelCapacity(block=8, soft_block=8),
)  # fmt: skip


def _x(seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), (1, N, DM))


@nnx.jit(static_argnames=("causal",))
def _output_and_grads(module, x, step, causal):
    """y, and the gradients of row t = N // 2 of y w.r.t. the router and x (one backward pass)."""
    ctx = AttentionContext(valid_len=jnp.asarray([N]), step=step, causal=causal)
    ct = jnp.sin(jnp.arange(DM, dtype=jnp.float32))

    def loss(module, x):
        out = module(x, ctx)
        return jnp.sum(out.y[0, N // 2] * ct), out

    (module_grad, dx), out = nnx.grad(loss, argnums=(0, 1), has_aux=True)(module, x)
    aux_grad = nnx.grad(lambda m: sum(m(x, ctx).aux_losses.values()))(module)
    return out, module_grad["router"], dx, aux_grad["router"]


@pytest.mark.parametrize("causal", [False, True])
def test_phases_router_gradients_and_causality(causal):
    module = CFG.make(DM, HEADS, rngs=nnx.Rngs(0))
    x = _x()
    ys = {}
    for name, step in (("soft", 0), ("ramp", 15), ("ramp_end", 19), ("straight_through", 25), ("hard", 35)):
        out, router_grad, dx, aux_grad = _output_and_grads(module, x, jnp.int32(step), causal)
        ys[name] = np.asarray(out.y)
        assert np.all(np.isfinite(ys[name]))
        norm = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(router_grad))
        aux_norm = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(aux_grad))
        if name != "hard":  # the hard phase's top-k has no gradient; the router learns in soft / ST phases
            assert norm > 0 and aux_norm > 0, name
        else:  # ... and the router losses do not move it there either (router.freeze_when_hard)
            assert norm == 0 and aux_norm == 0
        leak = np.abs(np.asarray(dx)[0, N // 2 + 1 :]).max()
        if causal:
            assert leak == 0.0, name  # nothing flows from the future, through any phase
        else:
            assert leak > 0.0
        assert set(out.aux_losses) == {"label_sparsity", "label_balance", "label_z_loss"}
        assert int(out.stats["capacity_overflow"]) == 0
        assert int(out.stats["phase"]) == schedule.PHASES[name.removesuffix("_end")]
    # Straight-through's forward is the hard pattern: two executors, one pattern.
    np.testing.assert_allclose(ys["straight_through"], ys["hard"], atol=2e-5, rtol=2e-5)
    assert np.max(np.abs(ys["soft"] - ys["hard"])) > 1e-3
    # The ramp ends next to the straight-through forward (α = 10/11 at its last step: dropped edges weigh q / 11).

    def gap(a, b):
        return np.max(np.abs(ys[a] - ys[b]))

    assert gap("ramp_end", "straight_through") < 0.5 * gap("ramp", "straight_through")


def test_hard_phase_runs_any_label_pattern_executor():
    """`implementation` picks the hard phase's executor through `sparse_attn.attention`: the dense oracle gives the
    default's ("bucketed") output, input gradient and `keys_per_query`; a name that is not registered fails early."""
    outs = {}
    for impl in (None, "reference"):
        cfg = dataclasses.replace(CFG, implementation=impl)
        module = cfg.make(DM, HEADS, rngs=nnx.Rngs(0))
        outs[impl] = _output_and_grads(module, _x(1), jnp.int32(INFERENCE_STEP), True)
    (o1, _, dx1, _), (o2, _, dx2, _) = outs[None], outs["reference"]
    np.testing.assert_allclose(o1.y, o2.y, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(dx1, dx2, atol=2e-5, rtol=2e-5)
    assert float(o1.stats["keys_per_query"]) == float(o2.stats["keys_per_query"]) > 1
    with pytest.raises(ValueError, match="implementation must be None or one of"):
        dataclasses.replace(CFG, implementation="packed")


def test_ramp_moves_the_forward_to_the_hard_pattern_before_the_switch():
    """Fixed weights across soft -> straight-through (docs/labels.md, "Phase transitions"). The blend alone spreads
    the change over the ramp but leaves weight on dropped edges until it ends (measured: the switch itself is 0.49
    of the whole change, dropped mass 0.038 at the ramp's last step). The default thinning removes dropped edges
    with probability α, so the ramp's last forward is the hard one up to a few edges (measured: 0.02 of the whole
    at the switch, dropped mass 0.001), and the dropped mass falls gradually (largest one-step fall 0.19 of its
    soft value). Single forwards vary more step to step under thinning (fresh draws; up to 0.85 of the whole here,
    N = 32); with no ramp the whole change comes at the switch."""
    x = _x(3)

    def ctx(s):
        return AttentionContext(valid_len=jnp.asarray([N]), step=jnp.int32(s), causal=True)

    def trace(cfg):  # steps 8..21: soft 8-9, ramp 10-19, straight-through from 20
        module = cfg.make(DM, HEADS, rngs=nnx.Rngs(0))
        run = nnx.jit(lambda m, x, s: (lambda o: (o.y, o.stats["dropped_mass"]))(m(x, ctx(s))))
        ys, dropped = zip(*[run(module, x, s) for s in range(8, 22)], strict=True)
        ys = [np.asarray(y) for y in ys]
        steps = np.asarray([np.max(np.abs(b - a)) for a, b in itertools.pairwise(ys)]) / np.max(np.abs(ys[-1] - ys[0]))
        return steps, np.asarray(dropped, np.float64)

    switch = 20 - 8 - 1  # index of the change from the ramp's last step to the first straight-through one
    blend, blend_dropped = trace(dataclasses.replace(CFG, ramp_thinning=False))
    assert 0.4 < blend[switch] and blend.max() < 0.6 and blend_dropped[switch] > 0.02
    thin, dropped = trace(CFG)
    assert thin[switch] < 0.1 and dropped[switch] < 0.01 and dropped[-1] == 0.0
    assert dropped[0] > 0.1 and np.max(-np.diff(dropped)) < 0.3 * dropped[0]
    no_ramp, _ = trace(dataclasses.replace(CFG, schedule=dataclasses.replace(CFG.schedule, ramp=0.0,
                                                                              straight_through=0.5)))
    assert no_ramp.max() > 0.9


def test_schedule_scales_to_the_run_and_says_when_it_is_cut_short():
    cfg = LabelAttentionConfig(num_labels=4, top_k=1, radius=3, capacity=LabelCapacity(block=8, soft_block=8))
    module = cfg.make(DM, HEADS, rngs=nnx.Rngs(0))
    assert module.fit_schedule(1000) == []
    steps = module.phase_steps()
    assert (steps.soft, steps.ramp, steps.straight_through, steps.anneal) == (300, 200, 300, 300)
    notes = module.fit_schedule(2)  # 0.2 of 2 steps: the ramp rounds to 0; hard starts at 2, the end
    assert any("ramp phase" in n and "0 steps" in n for n in notes) and any("hard phase" in n for n in notes)
    fixed = dataclasses.replace(cfg, schedule=LabelSchedule(num_steps=5000)).make(DM, HEADS, rngs=nnx.Rngs(0))
    notes = fixed.fit_schedule(1000)  # the config's own length wins; the run ends in the soft phase
    assert fixed.phase_steps().soft == 1500 and any("straight_through phase starts at step 2500" in n for n in notes)
    # Phase lengths fixed in steps whatever the run's length: fractions of a fixed num_steps (the 60 steps of soft
    # 40 + straight-through 20; τ anneals over the soft phase).
    absolute = dataclasses.replace(cfg, schedule=LabelSchedule(num_steps=60, soft=40 / 60, ramp=0.0,
                                                               straight_through=20 / 60, anneal=40 / 60))
    fitted = absolute.make(DM, HEADS, rngs=nnx.Rngs(0))
    assert fitted.fit_schedule(50) == ["the hard phase starts at step 60, at or after the run's end (50)"]
    assert fitted.phase_steps() == schedule.Schedule(soft=40, ramp=0, straight_through=20, anneal=40)
    unfitted = cfg.make(DM, HEADS, rngs=nnx.Rngs(0))
    assert unfitted.phase_steps() == cfg.schedule.phase_steps(DEFAULT_NUM_STEPS)
    with pytest.raises(ValueError, match="exceed 1"):
        LabelSchedule(soft=0.6, ramp=0.3, straight_through=0.2)
    with pytest.raises(ValueError, match="membership"):
        LabelRouterConfig(membership="softmax")


def test_pinned_phase_config_errors_and_model_plug_in():
    with pytest.raises(ValueError, match="num_labels"):
        LabelAttentionConfig(num_labels=65)
    with pytest.raises(ValueError, match="top_k"):
        LabelAttentionConfig(num_labels=4, top_k=5)
    with pytest.raises(ValueError, match="top_k"):
        LabelAttentionConfig(top_k=0)
    with pytest.raises(ValueError, match="phase"):
        LabelAttentionConfig(phase="warm")
    with pytest.raises(ValueError, match="balance"):
        LabelRouterConfig(balance="l2")
    cfg = TransformerConfig(
        vocab_size=16, model_dim=DM, num_heads=HEADS, num_layers=2, mlp_dim=32,
        attention=(CFG, LabelAttentionConfig(num_labels=4, top_k=1, radius=3, phase="hard",
                                             router=LabelRouterConfig(per_head=True, balance="switch"),
                                             capacity=LabelCapacity(block=8))),
    )  # fmt: skip
    model = TransformerLM(cfg, rngs=nnx.Rngs(1))
    tokens = jnp.arange(N, dtype=jnp.int32)[None] % 16
    run = nnx.jit(lambda m, t, s: m(t, step=s))
    out = run(model, tokens, 3)
    assert out.logits.shape == (1, N, 16) and np.isfinite(float(out.aux_loss))
    # Inference: INFERENCE_STEP is the hard phase at the final temperature, as any step past the schedule's end.
    phase0 = lambda o: float(o.stats.get("layer0/labels/phase", o.stats.get("layer0/phase")))  # noqa: E731
    inference, past_end = run(model, tokens, INFERENCE_STEP), run(model, tokens, 40)
    assert phase0(out) == schedule.SOFT and phase0(inference) == schedule.HARD
    np.testing.assert_array_equal(inference.logits, past_end.logits)
    # The model files a mechanism's own statistics as layer{i}/labels/{name} (layer{i}/{name} before that scheme).
    named = lambda i, key: {f"layer{i}/labels/{key}", f"layer{i}/{key}"} & set(out.stats)  # noqa: E731
    assert named(1, "mean_degree") and named(0, "tau") and "layer0/keys_per_query" in out.stats


def test_balance_losses_at_uniform_and_skewed_sizes():
    uniform = jnp.full((2, 1, 8), 5.0)
    skewed = jnp.asarray([[[20.0, 5, 5, 5, 2, 1, 1, 1]]] * 2)
    assert float(losses.cv2(uniform)) == pytest.approx(0.0, abs=1e-6)
    assert float(losses.switch(uniform, uniform)) == pytest.approx(1.0)
    assert float(losses.cv2(skewed)) > 0.5
    assert float(losses.switch(skewed, skewed)) > 1.5
    p = jnp.full((1, 1, 4, 3), 0.25)
    assert float(losses.sparsity(p, jnp.asarray([2]))) == pytest.approx(0.25)
    g = jax.grad(lambda s: losses.switch(skewed, s))(skewed)
    assert np.all(np.isfinite(np.asarray(g)))


def test_statistics_are_exact():
    n, d = 40, 8
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(5), (1, 1, n, d)), 1)
    z = oracles.z_from_labels(np.asarray(labels[0, 0]), d)
    h = oracles.base_graph(n, 3, 0, False, 36)
    keys = oracles.hard_mask(z, h).sum(-1)[None, None]
    sizes = z[:36].sum(0)[None, None]
    attended = keys + 3  # e.g. a soft phase's edges of H
    st = label_stats(
        jnp.asarray(attended), jnp.asarray(keys), jnp.asarray(sizes), heads=4, head_dim=8, causal=False,
        valid_len=jnp.asarray([36]), needed=12, reach=8,
    )  # fmt: skip
    deg = keys[0, 0, :36] - 1
    assert float(st["keys_per_query"]) == pytest.approx(attended[0, 0, :36].mean())
    assert float(st["reach_needed_ratio"]) == pytest.approx(1.5)
    assert float(st["frac_disconnected"]) == pytest.approx(np.mean(deg == 0))
    assert float(st["mean_degree"]) == pytest.approx(deg.mean())
    assert float(st["max_degree"]) == deg.max()
    assert float(st["attention_flops"]) == pytest.approx(4 * attended[0, 0, :36].sum() * 4 * 8)
    assert float(st["flops_vs_dense"]) == pytest.approx(attended[0, 0, :36].sum() / 36**2)
    hist = sum(float(v) for k, v in st.items() if k.startswith("bucket_hist/"))
    assert hist == d


def test_router_input_gradient_off_keeps_the_router_learning_and_the_residual_stream_unmoved():
    """router.input_gradient=False: same forward, the router still gets the task's and its losses' gradients, but
    none of them reaches x (the aux losses' dx is exactly 0; the output's dx drops the router's share)."""
    x = _x(3)
    ctx = AttentionContext(valid_len=jnp.asarray([N]), step=jnp.int32(25), causal=True)  # straight-through
    ys, dx_aux, dx_out = {}, {}, {}
    for flag in (True, False):
        router = dataclasses.replace(CFG.router, input_gradient=flag)
        module = dataclasses.replace(CFG, router=router).make(DM, HEADS, rngs=nnx.Rngs(0))
        out, router_grad, dx, aux_grad = _output_and_grads(module, x, jnp.int32(25), True)
        assert sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(router_grad)) > 0
        assert sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(aux_grad)) > 0
        dx_aux[flag] = np.asarray(jax.grad(lambda x_, m=module: sum(m(x_, ctx).aux_losses.values()))(x))
        ys[flag], dx_out[flag] = np.asarray(out.y), np.asarray(dx)
    np.testing.assert_array_equal(ys[True], ys[False])
    assert np.abs(dx_aux[True]).max() > 0 and np.abs(dx_aux[False]).max() == 0.0
    assert np.abs(dx_out[True] - dx_out[False]).max() > 0
