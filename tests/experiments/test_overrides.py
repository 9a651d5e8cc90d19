"""Dotted config overrides from the command line: parsing by field type, one-line errors naming the override, and
the LM runner training with them, storing them and refusing a resume that changes them."""

import pytest

from experiments.classification import train as classify
from experiments.lm import configs as lm_configs
from experiments.lm import train as lm
from experiments.retrieval import train as retrieval
from sparse_attn.studies.overrides import OverrideError, apply_overrides
from sparse_attn.train import checkpoint, run_config


def test_values_are_parsed_by_field_type_and_bad_ones_name_the_override():
    cfg = lm_configs.CONFIGS["smoke"]()
    got = apply_overrides(cfg, ["model.num_layers=3", "train.learning_rate=1e-3", "model.attention.0.radius=64",
                                "train.num_devices=none", "train.async_checkpoints=false", "train.num_devices=2"])
    assert (got.model.num_layers, got.train.learning_rate, got.model.attention[0].radius) == (3, 1e-3, 64)
    assert got.train.async_checkpoints is False and got.train.num_devices == 2
    assert cfg.model.num_layers != 3  # frozen configs: a new config, the named one untouched
    for bad, message in [
        ("model.num_layerz=3", "has no field 'num_layerz'"),
        ("model.num_layers=abc", "expected an integer"),
        ("train.learning_rate=nan", "finite number"),
        ("train.async_checkpoints=maybe", "true or false"),
        ("model.attention=dense", "a config, not a value"),
        ("model.attention.7.radius=3", "not an index"),
        ("train.num_steps=-5", "num_steps must be >= 0"),  # the config's own check
        ("num_layers", "expected field.path=value"),
    ]:
        with pytest.raises(OverrideError, match=message) as err:
            apply_overrides(cfg, [bad])
        assert bad.split("=")[0] in str(err.value) and "\n" not in str(err.value)


TINY = ["model.model_dim=32", "model.mlp_dim=64", "model.num_heads=2", "train.global_batch=8",
        "train.seq_len=32", "train.num_steps=2", "train.warmup_steps=1", "train.checkpoint_every=2",
        "train.eval_every=2", "train.eval_batches=1", "train.learning_rate=1e-3", "train.progress=false"]


def test_the_lm_runner_trains_with_overrides_stores_them_and_refuses_a_changed_resume(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    base = ["--config", "smoke", "--mechanism", "local", "--workdir", workdir]
    summary = lm.main(base + TINY + ["model.attention.0.radius=4"])
    assert summary["step"] == 2
    config = apply_overrides(lm_configs.CONFIGS["smoke"](), TINY)
    with checkpoint.make_manager(workdir, config.train) as manager:  # what the checkpoint holds
        stored = run_config.flatten(checkpoint.read_config(manager, 2))
    assert stored["model.model_dim"] == 32 and stored["train.learning_rate"] == 1e-3
    assert stored["model.attention.0.radius"] == 4, {k: v for k, v in stored.items() if "attention" in k}
    with pytest.raises(SystemExit) as exit_info:  # a resume that changes an override: refused, one line
        lm.main(base + TINY + ["model.attention.0.radius=8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "radius" in err[0]
    summary = lm.main(["--config", "smoke", "--mechanism", "local", "--workdir", str(tmp_path / "three")] + TINY
                      + ["model.num_layers=3"])  # --mechanism gives each of the 3 layers its config
    assert summary["step"] == 2
    with pytest.raises(SystemExit):
        lm.main(base + ["model.num_layerz=2"])
    assert "num_layerz" in capsys.readouterr().err


def test_the_classification_and_retrieval_runners_take_overrides(tmp_path):
    args = classify.parse_args(["--task", "digits", "--n", "64", "--config", "smoke", "model.num_layers=1",
                                "train.learning_rate=5e-4"])
    config = classify.config_from_args(args)
    assert (config.model.num_layers, config.train.learning_rate) == (1, 5e-4)
    calls = []
    retrieval.run_grid([("recall", retrieval.Cell(32, "dense", 8.0, 0))], config="smoke",
                       results=str(tmp_path / "r.jsonl"), runs_dir=str(tmp_path), time_limit_s=10,
                       run_cmd=lambda module, argv, limit: calls.append(argv) or 0, log=lambda m: None,
                       overrides=("train.num_steps=3",))  # fmt: skip
    assert calls[0][-1] == "train.num_steps=3"


def test_smoke_and_scratch_runs_write_untracked_results_unless_asked():
    from sparse_attn.studies.runs import default_results

    tracked = retrieval.RESULTS
    assert default_results(tracked, "runs/retrieval", config="cpu") == tracked  # a study cell
    assert default_results(tracked, "runs/retrieval", config="smoke") == "runs/retrieval/results.jsonl"
    assert default_results(tracked, "runs/retrieval", config="cpu", scratch=True) == "runs/retrieval/results.jsonl"
