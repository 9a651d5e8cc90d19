"""The LM experiment's real entry point: train, exact resume (RoPE on), config checks, summary, PNG, metrics."""

import argparse
import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from experiments.lm import configs as lm_configs
from experiments.lm import train as lm
from sparse_attn.data import TextSource
from sparse_attn.models import TransformerConfig
from sparse_attn.studies import cli
from sparse_attn.studies import lm as lm_objective
from sparse_attn.studies.mechanisms import mechanism_names
from sparse_attn.train import TrainConfig, read_metrics


def _micro(tmp_path) -> lm_configs.LMConfig:
    """2 layers (local, dense) x 32 wide; 3 steps on a small local text folder."""
    for i in range(30):
        (tmp_path / "text").mkdir(exist_ok=True)
        (tmp_path / "text" / f"f{i}.txt").write_text(f"def function_{i}(x):\n    return x + {i}\n" * 20)
    attention = tuple(lm_configs.attention_by_name(name, 16) for name in ("local", "dense"))  # RoPE on
    return lm_configs.LMConfig(
        model=TransformerConfig(model_dim=32, num_heads=2, num_layers=2, mlp_dim=64, attention=attention),
        data=TextSource(path=str(tmp_path / "text")),
        train=TrainConfig(global_batch=8, seq_len=16, num_steps=3, warmup_steps=1, checkpoint_every=2,
                          eval_every=2, eval_batches=1, tensorboard=True),
    )


def test_profile_steps_are_two_ordered_step_numbers():
    assert cli.step_range("2:5") == (2, 5)
    for bad in ("5:2", "3", "a:b", "-1:2"):
        with pytest.raises(argparse.ArgumentTypeError, match="A:B|0 <= A < B"):
            cli.step_range(bad)


def test_train_resume_summary_and_plot(tmp_path, capsys):
    config = _micro(tmp_path)
    workdir = str(tmp_path / "run")
    # The reference run also writes a profiler trace of steps 1 to 3 (tracing changes no result).
    reference = lm.train_and_evaluate(config, str(tmp_path / "ref"), log=lambda m: None, profile_steps=(1, 3))
    traces = [f for _, _, files in os.walk(tmp_path / "ref" / "profile") for f in files if f.endswith(".xplane.pb")]
    assert traces, "no jax.profiler trace under <workdir>/profile"
    short = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=2))
    lm.train_and_evaluate(short, workdir, log=lambda m: None)
    # Resumes at step 2 (a longer schedule than the checkpoint's, so named explicitly).
    summary = lm.train_and_evaluate(config, workdir, log=lambda m: None, allowed_changes=["train.num_steps"])
    # The real TransformerLM with RoPE resumes exactly: same losses and evaluation as one run.
    ref_losses = {s: r["loss"] for s, r in read_metrics(str(tmp_path / "ref")).items()}
    assert {s: r["loss"] for s, r in read_metrics(workdir).items()} == ref_losses
    assert summary["eval"] == reference["eval"]
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
    for name in mechanism_names(causal=True):
        att = lm_configs.attention_by_name(name, 16)
        config = TransformerConfig(model_dim=32, num_heads=2, num_layers=1, mlp_dim=64, attention=att)
        batch = {"inputs": jnp.zeros((2, 16), jnp.int32), "targets": jnp.zeros((2, 16), jnp.int32)}

        def loss(config=config, batch=batch):
            return lm_objective.loss_fn(lm.TransformerLM(config, rngs=nnx.Rngs(0)), batch, jnp.zeros((), jnp.int32))

        loss_shape, metrics = jax.eval_shape(loss)
        assert loss_shape.shape == () and metrics["bits_per_byte"].shape == (), name
    with pytest.raises(ValueError, match="dense"):
        lm_configs.attention_by_name("nope", 64)


def test_cli_resume_refuses_other_attention_or_text(tmp_path, monkeypatch, capsys):
    """On the command line a refused resume is one line naming the fields, exit status 2 (the train loop raises
    ConfigMismatchError, a ValueError)."""
    monkeypatch.setitem(lm_configs.CONFIGS, "micro", lambda: _micro(tmp_path))
    workdir = str(tmp_path / "run")
    lm.main(["--config", "micro", "--workdir", workdir, "--num_steps", "2"])
    (tmp_path / "other.txt").write_text("other text " * 200)

    def refused(*argv) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            lm.main(["--config", "micro", "--workdir", workdir, *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1, err
        return err[0]

    assert re.search(r"model\.attention\.0\._type: checkpoint 'LocalAttention'",
                     refused("--num_steps", "2", "--mechanism", "dense"))
    err = refused("--num_steps", "2", "--text", str(tmp_path / "other.txt"))
    assert re.search(r"data\.path: .*other\.txt", err) and "corpus.train_crc32" in err
    assert "train.num_steps: checkpoint 2 != now 3" in refused()
    summary = lm.main(["--config", "micro", "--workdir", workdir, "--allow_change", "train.num_steps"])
    assert summary["step"] == 3
