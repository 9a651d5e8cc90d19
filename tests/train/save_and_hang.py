"""Subprocess for test_kill_during_save: finish a save of step 1, start a large async save of
step 2, print SAVING and hang (the test SIGKILLs us mid-write). Not a test file."""

import pathlib
import sys
import time

import jax.numpy as jnp

from sparse_attn.train import TrainConfig, checkpoint

BIG = 96 * 2**20  # float32 elements: 384 MiB, so the write takes long enough to be cut


def main(workdir: str) -> None:
    manager = checkpoint.make_manager(workdir, TrainConfig(keep_checkpoints=3))
    checkpoint.save(manager, 1, {"w": jnp.full((1024,), 1.0)}, {"step": 1})
    manager.wait_until_finished()
    checkpoint.save(manager, 2, {"w": jnp.full((BIG,), 2.0)}, {"step": 2})
    # The temporary directory appears from a background thread; report once the write is under way.
    ckpt_dir = pathlib.Path(workdir) / "checkpoints"
    while not any(p.name.startswith("2.orbax-checkpoint-tmp") for p in ckpt_dir.iterdir()):
        time.sleep(0.01)
    print("SAVING", flush=True)
    sys.stdin.read()  # hang until killed


if __name__ == "__main__":
    main(sys.argv[1])
