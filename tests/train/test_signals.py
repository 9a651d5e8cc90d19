"""Preemption: SIGTERM finishes the step, saves it and exits 143; a second signal aborts at once."""

import os
import signal
import subprocess
import time

import train_harness as tiny

from sparse_attn.train import read_metrics
from sparse_attn.train.interrupt import DeferredInterrupt


def _start(workdir, *flags) -> subprocess.Popen:
    cmd = tiny.script_command(workdir, 100_000, "--checkpoint_every", 100_000, *flags)
    return subprocess.Popen(cmd, env=tiny.script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(proc, workdir, n: int) -> None:
    metrics, deadline = os.path.join(workdir, "metrics.jsonl"), time.monotonic() + 120
    while not (os.path.exists(metrics) and len(read_metrics(workdir)) >= n):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)


def _saved_steps(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def test_sigterm_saves_the_current_step_and_exits_143(tmp_path):
    workdir = str(tmp_path)
    with _start(workdir) as proc:
        try:
            _wait_for_steps(proc, workdir, 5)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    last = max(read_metrics(workdir))
    assert proc.returncode == 143, err[-3000:]
    assert f"interrupted by SIGTERM after step {last}; saved it to" in err, err[-3000:]
    assert _saved_steps(workdir) == [last]
    messages = []
    tiny.run(workdir, tiny.config(num_steps=last + 1, checkpoint_every=100_000), log=messages.append,
             allowed_changes=["train.num_steps"])
    assert any(f"at step {last}" in m for m in messages), messages


def _second_signal_during_the_save(workdir, first, second) -> tuple[int, str]:
    """Send `first`; once the save it triggers is under way (and stuck), send `second`."""
    with _start(workdir, "--hang_on_save") as proc:
        try:
            _wait_for_steps(proc, workdir, 3)
            proc.send_signal(first)
            assert proc.stdout.readline().strip() == "SAVING"
            t0 = time.monotonic()
            proc.send_signal(second)
            _, err = proc.communicate(timeout=60)
            assert time.monotonic() - t0 < 30, "the second signal did not abort promptly"
        finally:
            proc.kill()
    return proc.returncode, err


def test_second_sigint_after_sigterm_aborts_without_saving(tmp_path):
    returncode, err = _second_signal_during_the_save(str(tmp_path), signal.SIGTERM, signal.SIGINT)
    assert returncode == -signal.SIGINT, err[-3000:]  # an uncaught KeyboardInterrupt
    assert "KeyboardInterrupt" in err and "saved it to" not in err, err[-3000:]
    assert _saved_steps(str(tmp_path)) == []


def test_second_sigterm_after_sigint_kills_without_saving(tmp_path):
    returncode, err = _second_signal_during_the_save(str(tmp_path), signal.SIGINT, signal.SIGTERM)
    assert returncode == -signal.SIGTERM, err[-3000:]  # the default action: killed at once
    assert _saved_steps(str(tmp_path)) == []


def test_ignored_sigint_stays_ignored():
    previous, interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN), DeferredInterrupt()
    try:
        interrupt.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == interrupt._handle  # still deferred
        interrupt.restore()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupt.restore()
