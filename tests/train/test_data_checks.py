"""Data problems surface before training; a failing evaluation keeps the step's checkpoint."""

import os

import numpy as np
import pytest
import train_harness as tiny

from sparse_attn.data import RandomWindows, eval_batches
from sparse_attn.train import read_metrics, train_and_evaluate


def test_validation_shorter_than_a_window_fails_before_training(tmp_path):
    config = tiny.config(num_steps=4, seq_len=16)
    with pytest.raises(ValueError, match="shorter than one window"):
        tiny.run(str(tmp_path), config, eval_data=tiny.corpus_U8()[:10])
    assert not os.path.exists(tmp_path / "metrics.jsonl")  # not one step trained


def test_failing_evaluation_keeps_the_checkpoint_of_its_step(tmp_path):
    config = tiny.config(num_steps=4, checkpoint_every=2, eval_every=2, eval_batches=2)
    data = tiny.corpus_U8()
    kw = dict(global_batch=config.global_batch, seq_len=config.seq_len)

    def broken_eval_batches():
        """The first batch is fine (it passes the pre-training check); the second fails."""
        batches = eval_batches(data[:2000], num_batches=2, **kw)
        yield next(batches)
        raise OSError("validation file vanished")

    with pytest.raises(OSError, match="vanished"):
        train_and_evaluate(config, str(tmp_path), make_model=tiny.make_model, loss_fn=tiny.loss_fn,
                           eval_fn=tiny.eval_fn, train_iter=RandomWindows(data, seed=0, **kw),
                           eval_batches=broken_eval_batches, log=lambda m: None)
    assert sorted(read_metrics(str(tmp_path))) == [1, 2]
    assert os.listdir(tmp_path / "checkpoints") == ["2"]  # the work of steps 1-2 is kept
    messages = []
    summary = tiny.run(str(tmp_path), config, log=messages.append)
    assert any("resumed" in m and "step 2" in m for m in messages), messages
    assert summary["step"] == 4 and np.isfinite(summary["eval"]["nll"])
