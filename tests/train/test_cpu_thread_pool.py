"""A multi-device CPU mesh on a small XLA thread pool warns (it can deadlock in collectives); a large one does not."""

import warnings

import pytest

from sparse_attn.train import TrainConfig
from sparse_attn.train.mesh import make_mesh


def test_small_pool_warns(monkeypatch):
    monkeypatch.setenv("PJRT_NPROC", "8")  # one thread per device
    with pytest.warns(RuntimeWarning, match="8 CPU devices share a pool of 8 XLA threads.*PJRT_NPROC=32"):
        make_mesh(TrainConfig(global_batch=8))


def test_large_pool_and_one_device_do_not_warn(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setenv("PJRT_NPROC", "32")
        assert make_mesh(TrainConfig(global_batch=8)).devices.size == 8
        monkeypatch.setenv("PJRT_NPROC", "1")
        assert make_mesh(TrainConfig(global_batch=8, num_devices=1)).devices.size == 1
