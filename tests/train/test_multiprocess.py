"""Two JAX processes on localhost (jax.distributed, gloo) train like one process with 2 devices."""

import json
import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import train_harness as tiny

from sparse_attn.train import read_metrics

ATOL = 2e-5  # same fixed budget as the device-count test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process_with_two_devices(tmp_path):
    num_steps = 4
    workdir = str(tmp_path / "multi")
    coordinator = f"127.0.0.1:{_free_port()}"
    # The runtime ignores SIGTERM (PLATFORM.md): bound each process with SIGKILL.
    procs = [
        subprocess.Popen(
            ["timeout", "-s", "KILL", "150",
             *tiny.script_command(workdir, num_steps, "--coordinator", coordinator,
                                  "--num_processes", 2, "--process_id", i)],
            env=tiny.script_env(JAX_NUM_CPU_DEVICES=1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["process"] for r in results] == [0, 1]
    assert results[0]["eval"] == results[1]["eval"]
    assert results[0]["train"]["loss"] == results[1]["train"]["loss"]
    assert "devices': 2" in outs[0][1] and "processes': 2" in outs[0][1]

    single = tiny.run(str(tmp_path / "single"), tiny.config(num_devices=2, num_steps=num_steps))
    multi_losses = [r["loss"] for r in read_metrics(workdir).values()]  # written by process 0 only
    single_losses = [r["loss"] for r in read_metrics(str(tmp_path / "single")).values()]
    assert len(multi_losses) == num_steps
    np.testing.assert_allclose(multi_losses, single_losses, rtol=0, atol=ATOL)
    np.testing.assert_allclose(results[0]["eval"]["nll"], single["eval"]["nll"], rtol=0, atol=ATOL)


def _two_processes(workdir, num_steps, *extra, coordinator=None):
    coordinator = coordinator or f"127.0.0.1:{_free_port()}"
    return [
        subprocess.Popen(
            ["timeout", "-s", "KILL", "150",
             *tiny.script_command(workdir, num_steps, "--coordinator", coordinator, "--num_processes", 2,
                                  "--process_id", i, *extra)],
            env=tiny.script_env(JAX_NUM_CPU_DEVICES=1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip


def test_sigterm_on_one_host_stops_every_process_after_the_same_saved_step(tmp_path):
    """Preemption of one host: JAX's notifier catches the SIGTERM, every process saves the same step and exits
    143 (`Terminated`); both resume from it and continue exactly as one uninterrupted run."""
    workdir = str(tmp_path / "multi")
    # A constant learning rate after warm-up: the cut run (100000 steps planned) and the resumed one (a few more)
    # follow the same schedule as the reference.
    flags = ("--checkpoint_every", 1000, "--end_lr_fraction", 1.0)
    procs = _two_processes(workdir, 100000, *flags)
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.monotonic() + 120
    while not (os.path.exists(metrics) and len(read_metrics(workdir)) >= 10):  # training, past compilation
        assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)  # one host only
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], [err[-2000:] for _, err in outs]
    stop = re.search(r"interrupted by SIGTERM after step (\d+)", outs[0][1])  # process 0 speaks for the run
    assert stop, outs[0][1][-2000:]
    saved = int(stop.group(1))
    assert 10 <= saved < 100000
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps[-1] == saved, steps  # the step both processes wrote (an orbax save needs every process)

    resumed = _two_processes(workdir, saved + 4, *flags, "--allow_change", "train.num_steps")
    outs = [p.communicate(timeout=180) for p in resumed]
    assert [p.returncode for p in resumed] == [0, 0], [err[-2000:] for _, err in outs]
    single = str(tmp_path / "single")
    tiny.run(single, tiny.config(num_devices=2, num_steps=saved + 4, checkpoint_every=1000, end_lr_fraction=1.0))
    got = {s: r["loss"] for s, r in read_metrics(workdir).items() if s > saved}
    want = {s: r["loss"] for s, r in read_metrics(single).items() if s > saved}
    assert sorted(got) == list(range(saved + 1, saved + 5))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)], rtol=0, atol=ATOL)
