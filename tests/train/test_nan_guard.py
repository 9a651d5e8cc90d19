"""A NaN loss stops the run with a clear error and leaves the last good checkpoint restorable."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_harness as tiny

from sparse_attn.train import NonFiniteLossError, read_metrics


def _nan_from_step_index_3(model, batch, step):
    loss, metrics = tiny.loss_fn(model, batch, step)
    return jnp.where(step >= 3, jnp.nan, loss), metrics


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    config = tiny.config(num_steps=8, checkpoint_every=2, eval_every=8)
    with pytest.raises(NonFiniteLossError, match=r"at step 4.*Last good checkpoint: step 2"):
        tiny.run(str(tmp_path), config, loss_fn=_nan_from_step_index_3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    assert sorted(read_metrics(str(tmp_path))) == [1, 2, 3]

    # The good checkpoint resumes with a healthy loss function and trains to the end.
    messages = []
    summary = tiny.run(str(tmp_path), config, log=messages.append)
    assert any("resumed" in m and "step 2" in m for m in messages)
    assert np.isfinite(summary["train"]["loss"]) and summary["step"] == 8
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(summary["eval"]))


@jax.custom_vjp
def _nan_gradient_if(x, bad):
    return x


def _nan_gradient_fwd(x, bad):
    return x, bad


def _nan_gradient_bwd(bad, g):
    return jnp.where(bad, jnp.nan, g), None


_nan_gradient_if.defvjp(_nan_gradient_fwd, _nan_gradient_bwd)


def _nan_gradient_from_step_index_3(model, batch, step):
    loss, metrics = tiny.loss_fn(model, batch, step)
    return _nan_gradient_if(loss, step >= 3), metrics  # the loss itself stays finite


def test_nan_gradient_with_finite_loss_stops_on_grad_norm(tmp_path):
    config = tiny.config(num_steps=8, checkpoint_every=2, eval_every=8)
    # Named by the grad_norm check at the step it happens, not later by the state check.
    with pytest.raises(NonFiniteLossError, match=r"'grad_norm': nan\} at step 4.*Last good checkpoint: step 2"):
        tiny.run(str(tmp_path), config, loss_fn=_nan_gradient_from_step_index_3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    assert np.isfinite(read_metrics(str(tmp_path))[3]["loss"])


def test_diverging_update_is_not_saved_as_a_good_checkpoint(tmp_path):
    # Loss and gradient of step 1 are finite (computed before the update), but an infinite
    # learning rate turns the updated parameters into NaN/Inf: that state must not be saved.
    # (TrainConfig refuses a non-finite learning rate; the guard is tested behind that check.)
    config = tiny.config(num_steps=4, checkpoint_every=1, eval_every=4)
    object.__setattr__(config, "learning_rate", float("inf"))
    with pytest.raises(NonFiniteLossError, match=r"state after step 1 \(params.*none saved yet"):
        tiny.run(str(tmp_path), config)
    assert not [d for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()]
    record = read_metrics(str(tmp_path))[1]
    assert np.isfinite(record["loss"]) and np.isfinite(record["grad_norm"])
