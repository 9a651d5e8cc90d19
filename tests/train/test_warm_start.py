"""The train loop's `warm_start` hook: applied to the freshly initialized model before step 0, never on resume."""

import math

import jax.numpy as jnp
import pytest
import train_harness as tiny

from sparse_attn.train import read_metrics


class ZeroHead:
    """A warm start that zeroes the output layer (uniform logits: the first step's loss is ln 256) and counts
    its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, model):
        self.calls += 1
        model.out.kernel[...] = jnp.zeros_like(model.out.kernel[...])
        model.out.bias[...] = jnp.zeros_like(model.out.bias[...])


def test_warm_start_runs_once_before_step_0_and_not_on_resume(tmp_path):
    hook = ZeroHead()
    tiny.run(str(tmp_path), tiny.config(num_steps=2), warm_start=hook)
    assert hook.calls == 1
    first = read_metrics(str(tmp_path), "train")[1]["nll"]
    assert first == pytest.approx(math.log(tiny.VOCAB), abs=1e-5)  # the step-0 model is the warm-started one
    messages = []
    tiny.run(str(tmp_path), tiny.config(num_steps=4), warm_start=hook, log=messages.append,
             allowed_changes=("train.num_steps",))
    assert hook.calls == 1 and any("resumed" in m for m in messages)
    assert sorted(read_metrics(str(tmp_path), "train")) == [1, 2, 3, 4]


def test_without_warm_start_the_first_loss_is_the_initial_models(tmp_path):
    tiny.run(str(tmp_path), tiny.config(num_steps=1))
    assert abs(read_metrics(str(tmp_path), "train")[1]["nll"] - math.log(tiny.VOCAB)) > 1e-3
