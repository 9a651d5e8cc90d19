"""A tiny causal byte LM and its loss, for exercising the train machinery (not a test file).

Also runnable as a script (subprocess tests: kill/resume, multi-process):
    python tests/train/train_harness.py WORKDIR NUM_STEPS [--kill_at STEP] [--break_checkpoints_at STEP]
        [--hang_on_save] [--coordinator ADDR --num_processes N --process_id I] [--allow_change FIELD]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

VOCAB = 256


class TinyLM(nnx.Module):
    """Embedding -> causal mean-pool mixing -> MLP -> logits. Small, deterministic, has dropout."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
        self.mix = nnx.Linear(dim, dim, rngs=rngs)
        self.mlp = nnx.Linear(dim, dim, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(dim, VOCAB, rngs=rngs)

    def __call__(self, tokens_BxN):
        x_BxNxD = self.embed(tokens_BxN)
        n = tokens_BxN.shape[1]
        causal_NxN = jnp.tril(jnp.ones((n, n), jnp.float32)) / jnp.arange(1, n + 1, dtype=jnp.float32)[:, None]
        ctx_BxNxD = jnp.einsum("nm,bmd->bnd", causal_NxN, self.mix(x_BxNxD))
        h_BxNxD = x_BxNxD + self.drop(jax.nn.gelu(self.mlp(x_BxNxD + ctx_BxNxD)))
        return self.out(h_BxNxD)


def make_model(rngs: nnx.Rngs) -> TinyLM:
    return TinyLM(32, rngs=rngs)


def loss_fn(model, batch, step):
    del step
    logits_BxNxV = model(batch["inputs"])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits_BxNxV, batch["targets"]).mean()
    return nll, {"nll": nll}


def eval_fn(model, batch, step):
    del step
    logits_BxNxV = model(batch["inputs"])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits_BxNxV, batch["targets"]).mean()
    return {"nll": nll, "bits_per_byte": nll / jnp.log(2.0)}


def corpus_U8() -> np.ndarray:
    """Deterministic pseudo-text: a repeated phrase with noise (learnable, no files needed)."""
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 200, np.uint8).copy()
    flip = rng.random(text.size) < 0.05
    text[flip] = rng.integers(97, 123, flip.sum())
    return text


def config(**overrides):
    from sparse_attn.train import TrainConfig  # noqa: PLC0415

    base = dict(global_batch=8, seq_len=16, num_steps=6, learning_rate=1e-2, warmup_steps=2,
                checkpoint_every=2, eval_every=3, eval_batches=2, progress=False)
    return TrainConfig(**{**base, **overrides})


class KillAt:
    """Wraps a data iterator; SIGKILLs this process when asked for batch number `step + 1`,
    i.e. right after the loop started saving the checkpoint of `step`."""

    def __init__(self, it, step: int):
        self.it, self.kill_step = it, step

    def __next__(self):
        if self.it.step == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return next(self.it)

    def get_state(self):
        return self.it.get_state()

    def set_state(self, state):
        self.it.set_state(state)


class BreakCheckpointsAt(KillAt):
    """Replaces `<workdir>/checkpoints` by a file just before the save of `step`: every later
    write there fails, as on a read-only or vanished folder (chmod does not stop root)."""

    def __init__(self, it, step: int, workdir: str):
        super().__init__(it, step - 1)
        self.ckpt_dir = os.path.join(workdir, "checkpoints")

    def __next__(self):
        if self.it.step == self.kill_step:
            self._wait_for_earlier_saves()
            os.rename(self.ckpt_dir, self.ckpt_dir + ".moved")
            open(self.ckpt_dir, "w").close()  # noqa: SIM115
        return next(self.it)

    def _wait_for_earlier_saves(self, timeout_s: float = 60.0):
        """Let the background save of an earlier step finish first: breaking the folder under it
        fails *that* save, and the test means the save of `step` (a race seen on a loaded CI machine)."""
        deadline = time.monotonic() + timeout_s
        while any("orbax-checkpoint-tmp" in name for name in os.listdir(self.ckpt_dir)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"an earlier save in {self.ckpt_dir} did not finish in {timeout_s} s")
            time.sleep(0.05)


class HangOnSave(KillAt):
    """Prints SAVING and sleeps when a checkpoint save asks for the iterator state (a slow save)."""

    def __init__(self, it):
        super().__init__(it, -1)

    def get_state(self):
        print("SAVING", flush=True)
        time.sleep(600)
        return self.it.get_state()


def run(workdir: str, train_config, log=lambda msg: None, loss_fn=loss_fn, kill_at: int | None = None,
        wrap_iter=None, eval_data=None, **loop_kw) -> dict:
    """Train the tiny LM; `wrap_iter(iterator)` may wrap the train iterator, `eval_data` replace
    the validation bytes; `loop_kw` go to `train_and_evaluate` (experiment, allowed_changes, ...)."""
    from sparse_attn.data import RandomWindows, eval_batches  # noqa: PLC0415
    from sparse_attn.train import train_and_evaluate  # noqa: PLC0415

    data = corpus_U8()
    eval_data = data[:2000] if eval_data is None else eval_data
    kw = dict(global_batch=train_config.global_batch, seq_len=train_config.seq_len,
              process_index=jax.process_index(), process_count=jax.process_count())
    train_iter = RandomWindows(data, seed=train_config.seed, **kw)
    if kill_at is not None:
        train_iter = KillAt(train_iter, kill_at)
    if wrap_iter is not None:
        train_iter = wrap_iter(train_iter)
    return train_and_evaluate(
        train_config, workdir, make_model=make_model, loss_fn=loss_fn, eval_fn=eval_fn,
        train_iter=train_iter,
        eval_batches=lambda: eval_batches(eval_data, num_batches=train_config.eval_batches, **kw),
        log=log, **loop_kw,
    )


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_command(*args) -> list[str]:
    """argv to run this file as a subprocess with the current interpreter."""
    return [sys.executable, os.path.abspath(__file__), *map(str, args)]


def script_env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": REPO, **{k: str(v) for k, v in extra.items()}}
    return env


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # tests dump stacks of a stuck run
    # Ctrl-C as from a terminal: a suite started in the background (`pytest &`) passes SIGINT on ignored, and the
    # training loop leaves an ignored signal alone (test_signals.py::test_ignored_sigint_stays_ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("num_steps", type=int)
    parser.add_argument("--checkpoint_every", type=int, default=2)
    parser.add_argument("--kill_at", type=int)
    parser.add_argument("--break_checkpoints_at", type=int)
    parser.add_argument("--hang_on_save", action="store_true")
    parser.add_argument("--coordinator")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    parser.add_argument("--allow_change", action="append", default=[])
    parser.add_argument("--end_lr_fraction", type=float, default=0.1, help="1: a learning rate independent of "
                        "num_steps after warm-up (runs of different lengths share their first steps)")
    args = parser.parse_args()
    if args.coordinator:
        jax.config.update("jax_num_cpu_devices", 1)
    from sparse_attn.train import distributed

    distributed.initialize(args.coordinator, args.num_processes, args.process_id, timeout_s=60)
    def wrap(it):
        if args.break_checkpoints_at is not None:
            return BreakCheckpointsAt(it, args.break_checkpoints_at, args.workdir)
        return HangOnSave(it) if args.hang_on_save else it

    summary = run(args.workdir, config(num_steps=args.num_steps, checkpoint_every=args.checkpoint_every,
                                       end_lr_fraction=args.end_lr_fraction),
                  log=lambda msg: print(msg, file=sys.stderr, flush=True), kill_at=args.kill_at, wrap_iter=wrap,
                  allowed_changes=args.allow_change)
    print(json.dumps({"process": jax.process_index(), "eval": summary["eval"], "train": summary["train"]}),
          flush=True)
