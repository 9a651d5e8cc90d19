"""The LM experiment's real entry point: train, resume, summary, loss-curve PNG, metrics files."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from experiments import lm
from sparse_attn.models import TransformerConfig
from sparse_attn.train import TrainConfig, read_metrics


def _micro(tmp_path) -> lm.LMConfig:
    """2 layers (local, dense) x 32 wide; 3 steps on a small local text folder."""
    for i in range(30):
        (tmp_path / "text").mkdir(exist_ok=True)
        (tmp_path / "text" / f"f{i}.txt").write_text(f"def function_{i}(x):\n    return x + {i}\n" * 20)
    # rope_base=None: modules/rope.py broadcasts [B,N,1] * [F] (rank promotion, an error under this
    # suite's "raise" setting); reported upstream. The LM path under test does not depend on RoPE.
    attention = tuple(dataclasses.replace(lm.attention_by_name(name, 16), rope_base=None)
                      for name in ("local", "dense"))
    return lm.LMConfig(
        model=TransformerConfig(model_dim=32, num_heads=2, num_layers=2, mlp_dim=64, attention=attention),
        data=lm.TextSource(path=str(tmp_path / "text")),
        train=TrainConfig(global_batch=8, seq_len=16, num_steps=3, warmup_steps=1, checkpoint_every=2,
                          eval_every=2, eval_batches=1, tensorboard=True),
    )


def test_train_resume_summary_and_plot(tmp_path, capsys):
    config = _micro(tmp_path)
    workdir = str(tmp_path / "run")
    short = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=2))
    lm.train_and_evaluate(short, workdir, log=lambda m: None)
    summary = lm.train_and_evaluate(config, workdir, log=lambda m: None)  # resumes at step 2
    assert summary["step"] == 3 and summary["param_count"] > 0
    assert set(summary["memory_mib"]) >= {"argument_mib", "temp_mib"}
    assert sorted(read_metrics(workdir)) == [1, 2, 3]
    assert sorted(read_metrics(workdir, "valid")) == [2, 3]
    assert 0 < summary["eval"]["bits_per_byte"] < 9
    assert os.path.getsize(summary["plot"]) > 1000
    with open(os.path.join(workdir, "summary.json")) as f:
        assert json.load(f)["step"] == 3
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(os.path.join(workdir, "tensorboard")))
    lm.print_summary(summary)
    out = capsys.readouterr()
    assert "valid bits/byte" in out.out
    assert "loss=" in out.err  # the tqdm bar with the running loss


def test_every_named_attention_builds_a_causal_lm():
    for name in lm.ATTENTION_NAMES:
        att = dataclasses.replace(lm.attention_by_name(name, 16), rope_base=None)  # see _micro
        config = TransformerConfig(model_dim=32, num_heads=2, num_layers=1, mlp_dim=64, attention=att)
        batch = {"inputs": jnp.zeros((2, 16), jnp.int32), "targets": jnp.zeros((2, 16), jnp.int32)}

        def loss(config=config, batch=batch):
            return lm.loss_fn(lm.TransformerLM(config, rngs=nnx.Rngs(0)), batch, jnp.zeros((), jnp.int32))

        loss_shape, metrics = jax.eval_shape(loss)
        assert loss_shape.shape == () and metrics["bits_per_byte"].shape == (), name
    with pytest.raises(ValueError, match="dense"):
        lm.attention_by_name("nope", 64)
