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
