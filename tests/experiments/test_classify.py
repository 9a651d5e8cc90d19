"""The classification runner: every task's smoke config, exact resume after a mid-run Ctrl-C, the CLI, the
FLOP count of every mechanism family and the grid's bookkeeping (the report and the GPU script:
tests/experiments/test_classify_grid.py)."""

import dataclasses
import json
import math
import os
import signal

import jax.numpy as jnp
import pytest
from flax import nnx

from experiments.classification import configs
from experiments.classification import grid as classify_grid
from experiments.classification import train as classify
from sparse_attn.data.prefetch import PrefetchBatches
from sparse_attn.data.tasks import TaskBatches
from sparse_attn.modules import (
    AnchorAttentionConfig,
    AttentionContext,
    FixedAnchors,
    LocalAttention,
    NoncrossingAttentionConfig,
)
from sparse_attn.studies import classification as cm
from sparse_attn.studies import mechanisms as attention_names
from sparse_attn.studies.tasks import make_task
from sparse_attn.train import ConfigMismatchError, read_metrics

QUIET = dict(log=lambda m: None)


def _check_row(row, *, task, attention):
    assert row["task"] == task and row["n"] == 64 and row["mechanism"] == attention and row["steps"] == 4
    assert row["config"] == "smoke" and 0.0 <= row["accuracy"] <= 1.0 and math.isfinite(row["valid_loss"])
    assert row["num_validation"] == 16
    fl = row["flops"]
    assert 0 < fl["attention_per_step"] < fl["per_step"] and fl["total"] == pytest.approx(4 * fl["per_step"])
    (layer,) = row["layers"]
    assert layer["mechanism"] == attention and layer["attn_fwd_flops_per_example"] > 0
    assert row["memory_mib"]["temp_mib"] > 0 and row["memory_mib"]["peak_mib"] > row["memory_mib"]["temp_mib"]
    assert row["step_s"] > 0 and row["tokens_per_s"] > 0
    json.dumps(row, allow_nan=False)  # strict JSON: empty buckets are None, not NaN
    (point,) = row["curve"]  # the smoke config evaluates once, at the end
    assert point["step"] == 4 and point["train_flops"] == fl["total"] and point["accuracy"] == row["accuracy"]
    return layer


@pytest.mark.parametrize("task,attention", [
    ("listops", "abca"),            # explicit anchors at `]`; module-reported FLOPs
    ("dyck", "noncrossing_defect"),     # FLOPs from surviving arcs
    ("pathfinder", "local"),        # FLOPs from the pattern's statistics
])
def test_smoke_config_of_each_task(tmp_path, task, attention):
    row = classify.train_and_evaluate(configs.smoke(task, 64, attention), str(tmp_path), **QUIET)
    layer = _check_row(row, task=task, attention=attention)
    assert 0 < layer["attn_vs_dense"] < 1  # sparse: fewer pairs than dense
    with open(tmp_path / "result.json") as f:
        assert json.load(f)["accuracy"] == row["accuracy"]
    assert sorted(read_metrics(str(tmp_path))) == [1, 2, 3, 4]
    if task == "listops":
        assert layer["stats"]["abca/anchors"] > 0  # ListOps has `]` tokens: explicit anchors exist
    if task == "dyck":
        assert layer["stats"]["noncrossing/arcs"] > 0
    # The common statistics (batch means; the summary's figures weight batches by their valid tokens instead).
    assert 1 <= layer["stats"]["keys_per_query"] < 64 and 0 < layer["stats"]["attn_flops_vs_dense"] < 1
    if task in ("listops", "dyck"):  # accuracy by depth / distance bucket covers every example once
        buckets = row["accuracy_by_bucket"]
        assert sum(b["fraction"] for b in buckets.values()) == pytest.approx(1.0)
        weighted = sum(b["fraction"] * b["accuracy"] for b in buckets.values() if b["accuracy"] is not None)
        assert weighted == pytest.approx(row["accuracy"])
    else:
        assert row["accuracy_by_bucket"] is None


def test_cli_digits_dense_appends_a_result_line(tmp_path):
    results = tmp_path / "results" / "digits.jsonl"
    argv = ["--task", "digits", "--n", "64", "--mechanism", "dense", "--config", "smoke",
            "--workdir", str(tmp_path / "run"), "--results", str(results), "--profile_steps", "1:2"]
    row = classify.main(argv)
    traces = [f for _, _, files in os.walk(tmp_path / "run" / "profile") for f in files if f.endswith(".xplane.pb")]
    assert traces, "no jax.profiler trace under <workdir>/profile"
    for name in ("result.json", "loss_curves.png", "accuracy.png"):  # a run leaves its summary and curves
        assert (tmp_path / "run" / name).stat().st_size > 0, name
    _check_row(row, task="digits", attention="dense")
    assert row["layers"][0]["attn_vs_dense"] == pytest.approx(1.0)
    (line,) = results.read_text().splitlines()
    assert json.loads(line)["command"] == "python -m experiments.classification " + " ".join(argv)


@pytest.fixture
def terminal_sigint():
    """Ctrl-C as from a terminal for this test: a suite started in the background (`pytest &`, `bash .ci/run &`)
    inherits SIGINT ignored, and the train loop leaves an ignored signal ignored (docs/training.md)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_resume_mid_run_equals_uninterrupted(tmp_path, terminal_sigint):
    config = configs.smoke("listops", 64, "dense")
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, eval_every=2))
    reference = classify.train_and_evaluate(config, str(tmp_path / "ref"), **QUIET)

    def ctrl_c_after_step_2(msg):
        if msg.startswith("step 2: valid"):  # logged after step 2 is saved and evaluated
            signal.raise_signal(signal.SIGINT)

    workdir = str(tmp_path / "run")
    assert [p["step"] for p in reference["curve"]] == [2, 4]
    with pytest.raises(KeyboardInterrupt, match="after step 2"):
        classify.train_and_evaluate(config, workdir, log=ctrl_c_after_step_2)
    assert sorted(read_metrics(workdir)) == [1, 2]
    resumed = classify.train_and_evaluate(config, workdir, **QUIET)
    for split in ("train", "valid"):
        ref = read_metrics(str(tmp_path / "ref"), split)
        assert read_metrics(workdir, split) == ref and ref
    timing = ("step_s", "tokens_per_s", "wall_s", "date", "workdir")
    assert {k: v for k, v in resumed.items() if k not in timing} == {
        k: v for k, v in reference.items() if k not in timing}


def test_cli_parses_task_n_mechanism_config():
    args = classify.parse_args(["--task", "listops", "--n", "512", "--mechanism", "local,noncrossing_brick",
                                "--config", "full", "--seed", "2"])
    workdir = os.path.join("runs", "classify", "listops_n512_local+noncrossing_brick_full_s2")
    assert classify.default_workdir(args) == workdir
    with pytest.raises(ValueError, match="2 mechanism names"):  # the full config has 6 layers
        classify.config_from_args(args)
    args = classify.parse_args(["--task", "dyck", "--n", "128", "--mechanism", "local,dense,abca,abca_learned,"
                                "labels,noncrossing_defect", "--config", "full", "--num_steps", "7"])
    config = classify.config_from_args(args)
    att = config.model.attention
    assert config.task.seq_len == config.train.seq_len == 128 and config.train.num_steps == 7
    assert isinstance(att[0], LocalAttention) and att[0].radius == 32
    assert att[2].placement.kind == "explicit" and att[2].placement.anchor_id == 1 + config.task.k  # type-0 closer
    assert att[3].placement.kind == "learned" and att[3].placement.boundary_ids == tuple(range(9, 17))
    assert isinstance(att[5], NoncrossingAttentionConfig) and att[5].router == "defect_pair"
    assert classify.attention_spec(config.mechanisms) == args.mechanism  # rows name the cell as the grid does
    assert classify.attention_spec(configs.full("dyck", 128, "local").mechanisms) == "local"
    # Images have no anchor token: `abca` anchors row starts.
    image = configs.smoke("pathfinder", 1024, "abca").model.attention[0]
    assert isinstance(image, AnchorAttentionConfig) and image.placement == FixedAnchors(interval=32)
    for bad in (["--task", "digits", "--n", "128"], ["--task", "pathfinder", "--n", "1000"]):
        with pytest.raises(ValueError):
            classify.config_from_args(classify.parse_args([*bad, "--config", "smoke"]))
    with pytest.raises(ValueError, match="unknown mechanism .flash."):
        configs.smoke("listops", 64, "flash")
    with pytest.raises(SystemExit):
        classify.parse_args(["--task", "mnist", "--n", "64"])


def test_router_warm_start_fits_layer0_and_labels_the_rows(tmp_path):
    smoke = configs.smoke("dyck", 64, "noncrossing_defect")
    config = dataclasses.replace(smoke, router_warm_start=30, task=dataclasses.replace(smoke.task, num_train=240))
    # In a run: once, before step 0; its rows name it.
    messages = []
    row = classify.train_and_evaluate(config, str(tmp_path), log=messages.append)
    assert row["mechanism"] == "noncrossing_defect+warm30" and row["router_warm_start"] == 30
    assert messages.index("warm start applied to the initial model") < min(
        i for i, m in enumerate(messages) if m.startswith("step "))
    # 30 steps at 1e-2 cut the teacher-forced BCE at least in half.
    fit = [float(m.split()[-1]) for m in messages if m.startswith("warm-start step")]
    assert len(fit) == 2 and fit[1] < 0.5 * fit[0], fit
    args = classify.parse_args(["--task", "dyck", "--n", "64", "--mechanism", "noncrossing_defect", "--config",
                                "smoke", "--router_warm_start", "200"])
    assert classify.config_from_args(args).router_warm_start == 200
    assert classify.default_workdir(args).endswith("dyck_n64_noncrossing_defect+warm200_smoke_s0")
    with pytest.raises(ValueError, match="need 1600 training words, the task has 64"):  # 200 steps of 8 words
        classify.router_warm_start(classify.config_from_args(args))
    # A resume under another warm start, or none, is refused; cold runs record nothing (older runs resume).
    assert classify.warm_start_record(smoke) == {}
    with pytest.raises(ConfigMismatchError, match="router_warm_start"):
        classify.train_and_evaluate(dataclasses.replace(config, router_warm_start=0), str(tmp_path), **QUIET)
    # It needs bracket words and a defect-pair router in layer 0.
    with pytest.raises(ValueError, match="bracket words"):
        dataclasses.replace(configs.smoke("listops", 64, "noncrossing_defect"), router_warm_start=5)
    with pytest.raises(ValueError, match="defect-pair router"):
        dataclasses.replace(configs.smoke("dyck", 64, "dense"), router_warm_start=5)


def test_parse_names():
    assert attention_names.parse_names("local", 3) == ("local",) * 3
    assert attention_names.parse_names("local, dense", 2) == ("local", "dense")
    for bad in ("local,dense", "local,,dense", ""):
        with pytest.raises(ValueError):
            attention_names.parse_names(bad, 3)


def test_grid_runs_missing_cells_and_appends_rows(tmp_path):
    cells = [classify_grid.Cell("digits", 64, "dense", 0), classify_grid.Cell("digits", 64, "local", 0)]
    done_row = {"kind": "classify", "task": "digits", "n": 64, "mechanism": "dense", "seed": 0, "config": "smoke",
                "steps": 4}
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    (results_dir / "digits.jsonl").write_text(json.dumps(done_row) + "\n")
    calls = []

    def fake_run(argv, timeout_s):
        calls.append((argv, timeout_s))
        out = argv[argv.index("--results") + 1]
        with open(out, "a") as f:
            f.write(json.dumps({**done_row, "mechanism": "local"}) + "\n")
        return 0

    status = classify_grid.run_grid(cells, config="smoke", num_steps=None, results_dir=str(results_dir),
                                    runs_dir=str(tmp_path / "runs"), time_limit_s=30, run=fake_run, log=lambda m: None)
    assert status == {cells[0]: "done before", cells[1]: "finished"}
    ((argv, timeout_s),) = calls
    assert argv[:8] == ["--task", "digits", "--n", "64", "--mechanism", "local", "--config", "smoke"]
    assert timeout_s == 30
    lines = (results_dir / "digits.jsonl").read_text().splitlines()
    assert [json.loads(x)["mechanism"] for x in lines] == ["dense", "local"]
    # A cell that times out leaves no row and is reported; rerunning resumes it.
    status = classify_grid.run_grid([classify_grid.Cell("digits", 64, "bigbird", 1)], config="smoke",
                                    num_steps=None, results_dir=str(results_dir), runs_dir=str(tmp_path / "runs"),
                                    time_limit_s=30, run=lambda argv, t: 124, log=lambda m: None)
    assert list(status.values()) == ["timed out (rerun to resume)"]
    assert len((results_dir / "digits.jsonl").read_text().splitlines()) == 2
    doc_grid = classify_grid.GRIDS["noncrossing"]
    assert len(set(doc_grid)) == len(doc_grid)
    cells = {(c.task, c.n, c.mechanism) for c in doc_grid}
    assert cells >= {("listops", 2048, "noncrossing_defect"), ("dyck", 128, "local")}


def test_prefetch_gives_task_batches_and_resumes():
    source = make_task("listops", 64, num_train=40, num_validation=8).source("train")
    plain = TaskBatches(source, global_batch=8, seed=3)
    expected = [next(plain) for _ in range(7)]  # crosses an epoch (40 examples = 5 batches)
    pre = PrefetchBatches(source, global_batch=8, seed=3, depth=2)
    try:
        for b in expected[:4]:
            assert {k: v.tolist() for k, v in next(pre).items()} == {k: v.tolist() for k, v in b.items()}
        assert pre.get_state() == {"seed": 3, "step": 4}  # batches built ahead are not counted
        pre.set_state({"seed": 3, "step": 2})
        for b in expected[2:7]:
            assert {k: v.tolist() for k, v in next(pre).items()} == {k: v.tolist() for k, v in b.items()}
        with pytest.raises(ValueError, match="seed"):
            pre.set_state({"seed": 4, "step": 0})
    finally:
        pre.close()


def test_layer_attention_flops_from_the_common_statistic():
    """Pairs = keys_per_query (as the layer reports it) * heads * valid tokens, for every family alike."""
    vl = jnp.asarray([10, 64, 33], jnp.int32)
    kw = dict(valid_len_B=vl, heads=2, head_dim=16)
    ctx = AttentionContext(valid_len=vl)
    x = jnp.zeros((3, 64, 8))

    def reported(config):
        return config.make(8, 2, rngs=nnx.Rngs(0))(x, ctx).stats

    # Local window of radius 5 inside each valid prefix, counted by hand.
    pairs = sum(min(i + 5, v - 1) - max(i - 5, 0) + 1 for v in (10, 64, 33) for i in range(v))
    local = cm.layer_attention_flops(reported(LocalAttention(radius=5)), **kw)
    assert float(local) == pytest.approx(4 * 16 * 2 * pairs, rel=1e-6)
    dense = cm.layer_attention_flops(reported(attention_names.attention_config("dense", attention_names.Context.classifier(64))), **kw)
    assert float(dense) == pytest.approx(4 * 16 * 2 * (10**2 + 64**2 + 33**2), rel=1e-6)
    assert float(cm.layer_attention_flops({"keys_per_query": 2.5}, **kw)) == 4 * 16 * 2 * 2.5 * 107
    with pytest.raises(ValueError, match="no attention FLOP count"):
        cm.layer_attention_flops({"noncrossing/arcs": 1.0}, **kw)
