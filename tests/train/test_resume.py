"""Train -> checkpoint -> SIGKILL -> resume reproduces the uninterrupted run's losses exactly; Ctrl-C saves."""

import os
import re
import signal
import subprocess
import time

import numpy as np
import orbax.checkpoint as ocp
import train_harness as tiny

from sparse_attn.train import checkpoint, read_metrics

NUM_STEPS, KILL_AT = 10, 6


def test_kill_and_resume_matches_uninterrupted_run(tmp_path):
    config = tiny.config(num_steps=NUM_STEPS, checkpoint_every=2, eval_every=5)
    reference = tiny.run(str(tmp_path / "ref"), config)
    ref_train = read_metrics(str(tmp_path / "ref"))
    assert sorted(ref_train) == list(range(1, NUM_STEPS + 1))
    # Async saves are complete at return; the preservation policy kept the latest two.
    assert sorted(os.listdir(tmp_path / "ref" / "checkpoints")) == ["10", "8"]

    workdir = str(tmp_path / "run")
    proc = subprocess.run(tiny.script_command(workdir, NUM_STEPS, "--kill_at", KILL_AT),
                          env=tiny.script_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-3000:]  # SIGKILL, not a clean exit
    killed_steps = sorted(read_metrics(workdir))
    assert killed_steps[-1] == KILL_AT

    messages = []
    resumed = tiny.run(workdir, config, log=messages.append)
    (resumed_at,) = [int(m) for msg in messages for m in re.findall(r"resumed from .* at step (\d+)", msg)]
    # The save of step 6 may have been cut by the kill; then the run resumes from step 4.
    assert resumed_at in (KILL_AT - 2, KILL_AT)

    run_train = read_metrics(workdir)  # resumed records override the killed run's
    assert sorted(run_train) == list(range(1, NUM_STEPS + 1))
    for step in range(1, NUM_STEPS + 1):
        assert run_train[step]["loss"] == ref_train[step]["loss"], step
    np.testing.assert_equal(resumed["eval"], reference["eval"])
    assert reference["eval"]["bits_per_byte"] < 8.0  # it learned something beyond uniform


def test_resume_at_the_end_only_evaluates(tmp_path):
    config = tiny.config(num_steps=4, checkpoint_every=2, eval_every=4)
    first = tiny.run(str(tmp_path), config)
    messages = []
    again = tiny.run(str(tmp_path), config, log=messages.append)
    assert any("resumed" in m and "step 4" in m for m in messages)
    assert again["eval"] == first["eval"]
    assert again["step"] == 4 and "memory_mib" not in again  # nothing was compiled or trained


def test_ctrl_c_saves_the_current_step(tmp_path):
    workdir = str(tmp_path)
    cmd = tiny.script_command(workdir, 100_000, "--checkpoint_every", 50_000)
    with subprocess.Popen(cmd, env=tiny.script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            metrics = os.path.join(workdir, "metrics.jsonl")
            deadline = time.monotonic() + 120
            while not (os.path.exists(metrics) and len(read_metrics(workdir)) >= 20):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    last = max(read_metrics(workdir))
    assert f"KeyboardInterrupt: interrupted by SIGINT after step {last}" in err, err[-3000:]
    saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
    assert saved == [last], saved  # the interrupted step, checked and saved
    with checkpoint.make_manager(workdir, tiny.config()) as manager:
        data = manager.restore(last, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
    assert data == {"seed": 0, "step": last}  # the iterator saved in step with the model
