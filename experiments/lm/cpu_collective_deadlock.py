"""Reproduces the XLA:CPU all-reduce deadlock of docs/training.md ("Known platform issues"): the decode test's tiny
LM (local + label layer, 32 wide) trained on 8 fake CPU devices. With one pool thread per device it aborts (XLA's
40 s rendezvous timeout, "Fatal Python error: Aborted"), usually within a minute on 2 cores; with 4 per device it
prints "ok" after all steps.

Commands: PJRT_NPROC=8 python -m experiments.lm.cpu_collective_deadlock --steps 2000    (aborts)
          PJRT_NPROC=32 python -m experiments.lm.cpu_collective_deadlock --steps 2000   (ok, ~70 s)

Writes: a temporary run directory; prints `ok <seconds>` or aborts.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

from sparse_attn.studies import cli


def tiny_lm_config(root: pathlib.Path, **train):
    """The decode tests' LM (tests/decode/test_generate_evaluate.py): 1 local + 1 label layer x 32 wide, byte windows
    of 16 from 30 small files it writes under `root/text`. `train` overrides TrainConfig fields."""
    from experiments.lm import configs as lm_configs
    from sparse_attn.data import TextSource
    from sparse_attn.models import TransformerConfig
    from sparse_attn.train import TrainConfig

    (root / "text").mkdir(parents=True)
    for i in range(30):
        (root / "text" / f"f{i}.txt").write_text(f"def function_{i}(x):\n    return x + {i}\n" * 20)
    attention = (lm_configs.attention_by_name("local", 16), lm_configs.attention_by_name("labels", 16))
    return lm_configs.LMConfig(
        model=TransformerConfig(model_dim=32, num_heads=2, num_layers=2, mlp_dim=64, attention=attention),
        data=TextSource(path=str(root / "text")),
        train=TrainConfig(global_batch=8, seq_len=16, warmup_steps=1, eval_batches=2, progress=False, **train),
    )


@cli.entry_point
def main(argv=None):
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--sync_every", type=int, default=8)
    args = parser.parse_args(argv)
    # The test suite's settings (tests/conftest.py), before JAX starts its backend.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    from experiments.lm import train as lm

    root = pathlib.Path(tempfile.mkdtemp(prefix="collective_deadlock_"))
    config = tiny_lm_config(root, num_steps=args.steps, checkpoint_every=max(args.steps // 2, 1),
                            eval_every=args.steps, sync_every=args.sync_every)
    print(f"PJRT_NPROC={os.environ.get('PJRT_NPROC', 'unset')} devices={args.devices} steps={args.steps}", flush=True)
    start = time.time()
    lm.train_and_evaluate(config, str(root / "run"), log=lambda m: None)
    print(f"ok {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
