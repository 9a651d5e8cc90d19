"""A checkpoint save that fails stops the run at once with a clear error, and the process exits."""

import subprocess

import pytest
import train_harness as tiny

from sparse_attn.train import CheckpointSaveError, read_metrics

# Generous for a loaded 2-core machine; the bug this guards against hung for 300 s per save.
TIMEOUT_S = 120


def test_unwritable_checkpoint_folder_ends_the_run_promptly(tmp_path):
    workdir = str(tmp_path)
    cmd = ["timeout", "-s", "KILL", str(TIMEOUT_S),
           *tiny.script_command(workdir, 8, "--break_checkpoints_at", 4)]
    proc = subprocess.run(cmd, env=tiny.script_env(), capture_output=True, text=True, timeout=TIMEOUT_S + 30)
    assert proc.returncode not in (0, -9), proc.stderr[-3000:]  # -9: killed by the timeout, i.e. hung
    assert "CheckpointSaveError: saving step 4 to" in proc.stderr, proc.stderr[-3000:]
    assert max(read_metrics(workdir)) <= 5  # stopped at the failing save, not at the end of the run


class _UnsavableAt:
    """Train iterator whose state stops being JSON at `step`: orbax fails in its background thread."""

    def __init__(self, it, step: int):
        self.it, self.step = it, step

    def __next__(self):
        return next(self.it)

    def get_state(self):
        state = self.it.get_state()
        return {**state, "bad": {1, 2}} if state["step"] == self.step else state

    def set_state(self, state):
        self.it.set_state(state)


def test_failed_background_save_is_raised_at_the_next_step(tmp_path):
    config = tiny.config(num_steps=20, checkpoint_every=4, eval_every=20, sync_every=1)
    with pytest.raises(CheckpointSaveError, match="background save"):
        tiny.run(str(tmp_path), config, wrap_iter=lambda it: _UnsavableAt(it, 4))
    # Reported within steps of the failed save of step 4, not at the next save (8) or the end.
    assert max(read_metrics(str(tmp_path))) < 8
