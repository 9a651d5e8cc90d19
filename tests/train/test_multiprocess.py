"""Two JAX processes on localhost (jax.distributed, gloo) train like one process with 2 devices."""

import json
import socket
import subprocess

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
