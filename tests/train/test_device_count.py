"""1 vs 8 devices (data x fsdp) give the same losses; a checkpoint moves 8 -> 1 and 1 -> 8 devices."""

import shutil

import numpy as np
import train_harness as tiny

from sparse_attn.train import read_metrics

# float32 reductions are split differently across devices; a fixed budget for that.
ATOL = 2e-5


def _losses(workdir):
    return np.array([r["loss"] for r in read_metrics(workdir).values()])


def _finish_from_step_4(source, workdir, config) -> list[str]:
    """Copy `source`'s checkpoint of step 4 into `workdir` and finish the run there with `config`."""
    shutil.copytree(source / "checkpoints", workdir / "checkpoints")
    shutil.rmtree(workdir / "checkpoints" / "6")
    messages = []
    tiny.run(str(workdir), config, log=messages.append)
    assert any("resumed" in m and "step 4" in m for m in messages), messages
    return messages


def test_one_vs_eight_devices_and_restore_across_device_counts(tmp_path):
    config = dict(num_steps=6, checkpoint_every=2, eval_every=6)
    eight = tiny.run(str(tmp_path / "eight"), tiny.config(mesh_fsdp=2, **config))  # mesh 4 x 2
    one = tiny.run(str(tmp_path / "one"), tiny.config(num_devices=1, **config))
    assert (eight["num_devices"], one["num_devices"]) == (8, 1)
    losses8, losses1 = _losses(tmp_path / "eight"), _losses(tmp_path / "one")
    assert losses8.shape == (6,)
    np.testing.assert_allclose(losses1, losses8, rtol=0, atol=ATOL)
    assert losses8[-1] < losses8[0]

    # The 8-device checkpoint of step 4 finished on 1 device, and the 1-device one on 8 (4 x 2).
    _finish_from_step_4(tmp_path / "eight", tmp_path / "to_one", tiny.config(num_devices=1, **config))
    np.testing.assert_allclose(_losses(tmp_path / "to_one"), losses8[4:], rtol=0, atol=ATOL)
    messages = _finish_from_step_4(tmp_path / "one", tmp_path / "to_eight", tiny.config(mesh_fsdp=2, **config))
    assert any("'devices': 8" in m for m in messages), messages
    np.testing.assert_allclose(_losses(tmp_path / "to_eight"), losses1[4:], rtol=0, atol=ATOL)
