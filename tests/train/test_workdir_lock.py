"""One run per workdir: a second run fails naming the holder; a dead holder's lock does not block."""

import os
import subprocess
import sys

import pytest
import train_harness as tiny

from sparse_attn.train import WorkdirLockedError, workdir_lock

# Another process holding the lock like a run does (stdlib only, so it starts in milliseconds).
HOLDER = f"""
import sys
sys.path.insert(0, {os.path.dirname(workdir_lock.__file__)!r})
import workdir_lock
with workdir_lock.hold(sys.argv[1]):
    print("HOLDING", flush=True)
    sys.stdin.read()
"""


def test_second_run_on_a_workdir_fails_naming_the_first(tmp_path):
    with subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout.readline().strip() == "HOLDING"
            with pytest.raises(WorkdirLockedError, match=f"in use by another run \\(pid {holder.pid} on "):
                tiny.run(str(tmp_path), tiny.config(num_steps=2))
        finally:
            holder.kill()
            holder.wait(timeout=30)
    assert not os.path.exists(tmp_path / "metrics.jsonl")  # refused before writing anything

    # The holder died without cleaning up: its lock file remains but no longer blocks.
    assert os.path.exists(tmp_path / workdir_lock.LOCK_FILE)
    summary = tiny.run(str(tmp_path), tiny.config(num_steps=2, eval_every=2))
    assert summary["step"] == 2


def test_lock_is_exclusive_within_a_process_too(tmp_path):
    with workdir_lock.hold(str(tmp_path)):
        with pytest.raises(WorkdirLockedError, match=f"pid {os.getpid()} "):
            with workdir_lock.hold(str(tmp_path)):
                pass
    with workdir_lock.hold(str(tmp_path)):  # released on exit
        pass
