"""1 vs 8 devices (data x fsdp) give the same losses; a checkpoint restores onto another device count."""

import shutil

import numpy as np
import train_harness as tiny

from sparse_attn.train import read_metrics

# float32 reductions are split differently across devices; a fixed budget for that.
ATOL = 2e-5


def _losses(workdir):
    return np.array([r["loss"] for r in read_metrics(workdir).values()])


def test_one_vs_eight_devices_and_restore_onto_one(tmp_path):
    config = dict(num_steps=6, checkpoint_every=2, eval_every=6)
    eight = tiny.run(str(tmp_path / "eight"), tiny.config(mesh_fsdp=2, **config))  # mesh 4 x 2
    one = tiny.run(str(tmp_path / "one"), tiny.config(num_devices=1, **config))
    assert (eight["num_devices"], one["num_devices"]) == (8, 1)
    losses8, losses1 = _losses(tmp_path / "eight"), _losses(tmp_path / "one")
    assert losses8.shape == (6,)
    np.testing.assert_allclose(losses1, losses8, rtol=0, atol=ATOL)
    assert losses8[-1] < losses8[0]

    # Take the 8-device checkpoint of step 4 and finish the run on 1 device.
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "eight" / "checkpoints", moved / "checkpoints")
    shutil.rmtree(moved / "checkpoints" / "6")
    messages = []
    tiny.run(str(moved), tiny.config(num_devices=1, **config), log=messages.append)
    assert any("resumed" in m and "step 4" in m for m in messages), messages
    np.testing.assert_allclose(_losses(moved), losses8[4:], rtol=0, atol=ATOL)
