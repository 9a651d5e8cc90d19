"""SIGKILL during an async save leaves the previous checkpoint restorable."""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import train_harness as tiny

from sparse_attn.train import TrainConfig, checkpoint


def test_sigkill_mid_save_keeps_previous_checkpoint(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "save_and_hang.py")
    with subprocess.Popen([sys.executable, script, str(tmp_path)], env=tiny.script_env(),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            line = proc.stdout.readline()
            if line.strip() == "SAVING":
                proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            _, stderr = proc.communicate(timeout=30)
    assert line.strip() == "SAVING", stderr[-3000:]
    entries = os.listdir(tmp_path / "checkpoints")
    assert "1" in entries and "2" not in entries, entries  # killed before the rename of step 2
    assert any(e.startswith("2.orbax-checkpoint-tmp") for e in entries), entries

    with checkpoint.make_manager(tmp_path, TrainConfig()) as manager:
        assert manager.latest_step() == 1
        target = {"w": jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
            jax.devices()[0]))}
        state, data_state = checkpoint.restore(manager, target)
    np.testing.assert_array_equal(np.asarray(state["w"]), np.ones(1024, np.float32))
    assert data_state == {"step": 1}
