"""Preservation policy: the latest N checkpoints plus every keep_period-th step; data state rides along."""

import os

import jax.numpy as jnp

from sparse_attn.train import TrainConfig, checkpoint


def test_latest_n_plus_periodic_steps(tmp_path):
    config = TrainConfig(keep_checkpoints=2, keep_period=3)
    with checkpoint.make_manager(tmp_path, config) as manager:
        for step in range(1, 9):
            checkpoint.save(manager, step, {"w": jnp.full((4,), float(step))}, {"step": step})
    kept = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
    assert kept == [3, 6, 7, 8]
    with checkpoint.make_manager(tmp_path, config) as manager:
        state, data = checkpoint.restore(manager, {"w": jnp.zeros((4,))}, step=6)
    assert data == {"step": 6} and float(state["w"][0]) == 6.0


def test_restore_of_an_empty_workdir_is_none(tmp_path):
    with checkpoint.make_manager(tmp_path, TrainConfig()) as manager:
        assert checkpoint.restore(manager, {"w": jnp.zeros((4,))}) is None
