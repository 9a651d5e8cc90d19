"""The CPU grid's plan and bookkeeping (resume skips, rows gain commit and load, deadlines), the results report
(tables, the non-crossing verdicts, other sections kept, renamed statistics) and the GPU budget script's planning and
time limits. Fake runs and clocks: no training here (tests/experiments/test_classify.py trains)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.classification import grid as classify_grid
from experiments.classification.grid import Cell
from experiments.gpu import classify as gpu_classify
from experiments.reports import classification_tables
from experiments.reports import results as report_results
from sparse_attn.data.tasks import Pathfinder
from sparse_attn.studies.tasks import make_task

QUIET = dict(log=lambda m: None)


def _fake_run(calls, *, row_extra=None, rc=0):
    """A classify subprocess stand-in: records argv and writes a row to the cell's own results file."""
    def run(argv, timeout_s):
        calls.append((argv, timeout_s))
        a = dict(zip(argv[::2], argv[1::2], strict=True))
        config = a["--config"]
        steps = int(a.get("--num_steps", classify_grid.CONFIGS[config]().train.num_steps))
        row = {"kind": "classify", "task": a["--task"], "n": int(a["--n"]), "mechanism": a["--mechanism"],
               "seed": int(a["--seed"]), "config": config, "steps": steps, "accuracy": 0.5,
               "command": "python -m experiments.classification " + " ".join(argv), **(row_extra or {})}
        if rc == 0:
            with open(a["--results"], "a") as f:
                f.write(json.dumps(row) + "\n")
        return rc
    return run


def test_cpu_grid_plan_order_and_selection():
    cells = classify_grid.GRIDS["cpu"]
    assert len(cells) == len(set(cells)) == 3 * 6 * 2 * 3 + 3
    assert {(c.task, c.mechanism) for c in cells} == {
        (t, a) for t in ("listops", "dyck", "pathfinder")
        for a in ("dense", "local", "longformer", "abca", "noncrossing_defect", "labels")} | {("dyck", classify_grid.WARM)}
    warm = [c for c in cells if c.mechanism == classify_grid.WARM]
    assert [(c.n, c.seed) for c in warm] == [(128, 0), (128, 1), (128, 2)]
    assert classify_grid.attention_argv(classify_grid.WARM) == [
        "--mechanism", "noncrossing_defect", "--router_warm_start", "200"]
    assert classify_grid.attention_argv("local,abca") == ["--mechanism", "local,abca"]
    # Priority: ListOps n=128 seed 0 (dense, local, the mechanisms but labels) first, then Dyck/Pathfinder
    # dense/local, then ListOps n=512; labels only after every other mechanism's seed-0 n=128 cell.
    assert all(c.steps == classify_grid.CPU_STEPS[c.n] for c in cells)
    assert [(c.task, c.n, c.mechanism, c.seed) for c in cells[:12]] == [
        ("listops", 128, a, 0) for a in ("dense", "local", "longformer", "abca", "noncrossing_defect")
    ] + [(t, 128, a, 0) for t in ("dyck", "pathfinder") for a in ("dense", "local")] + [
        ("listops", 512, a, 0) for a in ("dense", "local", "noncrossing_defect")]
    first_labels = min(i for i, c in enumerate(cells) if c.mechanism == "labels")
    assert {(c.task, c.mechanism) for c in cells[:first_labels] if c.n == 128 and c.seed == 0} == {
        (t, a) for t in ("listops", "dyck", "pathfinder") for a in ("dense", "local", *classify_grid.CPU_MECHANISMS)}
    # Shards partition the selection; filters compose.
    sel = classify_grid.select(cells, skip=f"labels,{classify_grid.WARM}", lengths=(128,), seeds="1,2")
    assert len(sel) == 3 * 5 * 2 and all(c.n == 128 and c.seed in (1, 2) and c.mechanism != "labels" for c in sel)
    dyck = classify_grid.select(cells, only="dense", seeds="1", tasks=("dyck",))
    assert dyck == [Cell("dyck", 128, "dense", 1, 600), Cell("dyck", 512, "dense", 1, 300)]
    halves = [classify_grid.select(cells, only="dense,local", shard=f"{i}/2") for i in range(2)]
    assert sorted(halves[0] + halves[1]) == sorted(classify_grid.select(cells, only="dense,local"))
    assert not set(halves[0]) & set(halves[1])
    with pytest.raises(ValueError, match="shard"):
        classify_grid.select(cells, shard="2/2")
    with pytest.raises(ValueError, match="--only flash is not in this grid; choose from abca, dense"):
        classify_grid.select(cells, only="dense,flash")  # a typo selects nothing: refused, not an empty run


def test_grid_resume_skip_row_fields_and_deadline(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    cells = [Cell("dyck", 64, "dense", 0, 3), Cell("dyck", 64, "local", 0, 3), Cell("dyck", 64, "local", 1, 3)]
    calls = []
    kw = dict(config="smoke", num_steps=None, results_dir=str(results), runs_dir=str(runs), time_limit_s=50,
              commit="abc1234", grid="test", grid_command="python -m experiments.classification.grid --grid test", **QUIET)
    status = classify_grid.run_grid(cells[:2], run=_fake_run(calls), **kw)
    assert list(status.values()) == ["finished", "finished"]
    argv = calls[0][0]
    assert argv[argv.index("--num_steps") + 1] == "3"  # the cell's steps (smoke's default is 4)
    assert argv[argv.index("--results") + 1] == str(runs / "smoke" / "dyck_n64_dense_s0" / "row.jsonl")
    rows = [json.loads(x) for x in (results / "dyck.jsonl").read_text().splitlines()]
    assert [r["mechanism"] for r in rows] == ["dense", "local"]
    r = rows[0]
    assert r["git_commit"] == "abc1234" and r["grid_command"].endswith("--grid test") and r["steps"] == 3
    assert set(r["load"]) == {"start", "end", "mean", "max", "samples"} and r["load"]["max"] >= r["load"]["mean"] >= 0

    # Rerun: finished cells are skipped (same steps); other steps are another cell.
    calls.clear()
    status = classify_grid.run_grid(cells, run=_fake_run(calls), **kw)
    assert list(status.values()) == ["done before", "done before", "finished"] and len(calls) == 1
    status = classify_grid.run_grid([cells[0]._replace(steps=5)], run=_fake_run(calls), **kw)
    assert list(status.values()) == ["finished"]

    # A run that exits 0 without a row, or fails, appends nothing.
    n_lines = len((results / "dyck.jsonl").read_text().splitlines())
    status = classify_grid.run_grid([Cell("dyck", 64, "abca", 0, 3)], run=lambda argv, t: 0, **kw)
    assert list(status.values()) == ["failed (no result row)"]
    status = classify_grid.run_grid([Cell("dyck", 64, "abca", 0, 3)], run=_fake_run([], rc=3), **kw)
    assert list(status.values()) == ["failed (exit 3)"]
    assert len((results / "dyck.jsonl").read_text().splitlines()) == n_lines

    # A cell claimed by a live process is left to it; a dead process's claim is taken over.
    claimed = runs / "smoke" / "dyck_n64_abca_s1"
    claimed.mkdir(parents=True)
    (claimed / classify_grid.CLAIM).write_text(str(os.getpid()))
    status = classify_grid.run_grid([Cell("dyck", 64, "abca", 1, 3)], run=_fake_run(calls), **kw)
    assert list(status.values()) == ["running elsewhere"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (claimed / classify_grid.CLAIM).write_text(str(dead.pid))
    assert classify_grid.claim(str(claimed)) and (claimed / classify_grid.CLAIM).read_text() == str(os.getpid())
    os.remove(claimed / classify_grid.CLAIM)

    # Deadline: the time limit shrinks to what is left; nothing starts with less than min_cell_s left.
    calls.clear()
    now = [1000.0]
    status = classify_grid.run_grid([Cell("dyck", 64, "abca", 1, 3), Cell("dyck", 64, "abca", 2, 3)],
                                    run=_fake_run(calls), deadline=1020.0, min_cell_s=30, clock=lambda: now[0],
                                    **{**kw, "time_limit_s": 900})
    assert list(status.values()) == ["not started (deadline)"] * 2 and not calls
    status = classify_grid.run_grid([Cell("dyck", 64, "abca", 1, 3)], run=_fake_run(calls), deadline=1100.0,
                                    min_cell_s=30, clock=lambda: now[0], **{**kw, "time_limit_s": 900})
    assert list(status.values()) == ["finished"] and calls[0][1] == pytest.approx(100.0)
    assert classify_grid.parse_deadline("04:52", now=86400 * 10 + 3600) == 86400 * 10 + 4 * 3600 + 52 * 60
    assert classify_grid.parse_deadline("00:30", now=86400 * 10 + 3600) == 86400 * 11 + 30 * 60


def _row(task, n, attention, seed, acc, *, peak=100.0, ratio=None, config="cpu", rename=False, **extra):
    ratio = (1.0 if attention == "dense" else 0.3) if ratio is None else ratio
    layer = {"mechanism": attention, "keys_per_query": ratio * n, "stats": {"arcs": 2.0}}
    layer["attn_flops_vs_dense" if rename else "attn_vs_dense"] = ratio
    return {"kind": "classify", "task": task, "n": n, "mechanism": attention, "config": config, "seed": seed,
            "steps": 200, "accuracy": acc, "valid_loss": 2.0 - acc, "flops": {"total": 1e12, "per_step": 5e9},
            "curve": [{"step": 100, "train_flops": 5e11, "accuracy": acc - 0.1, "valid_loss": 2.1 - acc},
                      {"step": 200, "train_flops": 1e12, "accuracy": acc, "valid_loss": 2.0 - acc}],
            "memory_mib": {"peak_mib": peak, "temp_mib": peak - 2}, "step_s": 0.3, "tokens_per_s": 7e3,
            "layers": [layer, layer], "backend": "cpu", "device": "cpu", "jax": "0.10.2", "git_commit": "abc1234",
            "load": {"mean": 9.5}, "command": f"python -m experiments.classification --task {task} --n {n} "
                                             f"--mechanism {attention}", **extra}


def test_report_tables_verdicts_and_sections(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    rows = []
    nc = "noncrossing_defect"
    for task, accs in (("listops", {"dense": (0.40, 0.42), "local": (0.30, 0.32), nc: (0.40, 0.41)}),
                       ("pathfinder", {"dense": (0.70, 0.72), "local": (0.70, 0.71), nc: (0.5, 0.5)})):
        for att, (a0, a1) in accs.items():
            peak = 100.0 if att == "dense" else 120.0 if att == "local" else 40.0
            # Seed 1 of noncrossing uses the renamed statistic: read alike.
            rows += [_row(task, 128, att, 0, a0, peak=peak), _row(task, 128, att, 1, a1, peak=peak,
                                                                     rename=att == "noncrossing_defect")]
    (results / "listops.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["task"] == "listops")
                                           + "not json\n")
    (results / "pathfinder.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows
                                                      if r["task"] == "pathfinder"))
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    out.write_text("# Results\n\nintro kept\n\n## Language modelling\n\nLM section kept\n")
    written = report_results.render(str(results), str(out), plots_dir=str(tmp_path / "plots"), note="Shared CPU.")
    text = out.read_text()
    assert "LM section kept" in text and "intro kept" in text and "Shared CPU." in text
    assert text.count(report_results.BEGIN) == 1
    # Headline rows: mean ± std, Δ vs dense in points with its std, peak with its ratio to dense.
    assert "| 128 | dense | 2 | 200 | 0.410 ± 0.014 | – | 1.00 | 100.0 |" in text
    assert "| 128 | local | 2 | 200 | 0.310 ± 0.014 | -10.0 ± 1.4 | 0.30 | 120.0 (1.20×) |" in text
    assert "| 128 | noncrossing_defect | 2 | 200 | 0.405 ± 0.007 | -0.5 ± 1.1 | 0.30 | 40.0 (0.40×) |" in text
    # Verdicts: noncrossing is within a point of dense on ListOps at 0.3x the pairs, and fails on Pathfinder;
    # local is 10 points down (claim 1: no) and does not fail on images (claim 2: no).
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    nc = lines["**noncrossing_defect**"].split("|")
    assert [c.strip() for c in nc[2:5]] == ["**yes** (no dyck cells)", "**yes**: listops 128: -0.5", "**yes**"]
    assert nc[6].strip() == "**yes**"
    loc = lines["local"].split("|")
    assert loc[2].strip() == "**no** (no dyck cells)" and loc[6].strip() == "**no**"
    assert "dense separates from local (dense − local = +10.0 ± 1.4 points, 2 σ needed)" in text
    assert "validation loss dense 1.590 vs local 1.690" in text  # mean over seeds, beside the accuracies
    assert "(noncrossing_defect, `cpu`): claim 1 **yes**; claim 2 **yes**." in text
    assert ("above chance (more than 2 points over the majority class) on 2 of 2 task/length cells (listops 128, "
            "pathfinder 128) and ahead of local by 2 σ on 1 (listops 128)") in text
    assert "| 128 | noncrossing_defect | 2 | 200 | 0.500 ± 0.000 (chance) | -21.0 ± 1.0 |" in text
    # The majority class of the examples a row was validated on (counted), or the task's known rate.
    labels = [int(make_task("dyck", 64, num_train=1, num_validation=12).source("validation")[i]["label"])
              for i in range(12)]
    assert classification_tables.majority("dyck", 64, 12) == max(labels.count(0), labels.count(1)) / 12
    assert classification_tables.majority("dyck", 64, None) == classification_tables.CHANCE["dyck"]
    assert "pathfinder n=128 (cpu): dense does **not** separate from local" in text
    assert "* local on listops n=128 (cpu): accuracy -10.0 points; 1.20× dense's step memory." in text
    assert "* noncrossing_defect on pathfinder n=128 (cpu): accuracy -21.0 points." in text
    assert "**No full-scale (`--config full`) rows yet**" in text
    assert len(written) == 6 and all(os.path.getsize(p) > 1000 for p in written)
    # Re-rendering replaces the section, keeps the rest.
    report_results.render(str(results), str(out), plots_dir=str(tmp_path / "plots"))
    again = out.read_text()
    assert again.count(report_results.BEGIN) == 1 and "LM section kept" in again and "Shared CPU." not in again


def test_report_names_the_steps_where_a_cell_ran_at_two_step_counts(tmp_path):
    """A longer run of the same task and n is its own cell; its verdicts say which one they mean."""
    results = tmp_path / "results"
    results.mkdir()
    rows = [_row("listops", 128, att, seed, acc) for att, acc in (("dense", 0.40), ("local", 0.30)) for seed in (0, 1)]
    rows += [dict(_row("listops", 128, att, 0, acc), steps=400) for att, acc in (("dense", 0.45), ("local", 0.46))]
    (results / "listops.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.md"
    report_results.render(str(results), str(out), plots_dir=str(tmp_path / "plots"))
    text = out.read_text()
    assert "| **no** (no dyck cells) | **no**: listops 128 (200 steps): -10.0, listops 128 (400 steps): +1.0 |" in text
    assert "* listops n=128 (200 steps) (cpu): dense separates from local" in text
    assert "* listops n=128 (400 steps) (cpu): one seed only, dense − local = -1.0 points" in text


def test_report_with_no_rows_and_no_file(tmp_path):
    out = tmp_path / "results.md"
    assert report_results.render(str(tmp_path), str(out), plots_dir=str(tmp_path)) == []
    text = out.read_text()
    assert text.startswith("# Results") and "No results yet" in text


def test_gpu_plan_dry_run_and_budget(tmp_path, capsys):
    entries = gpu_classify.main(["--dry_run", "--budget", "570"])
    planned = [e for e in entries if e["planned"]]
    assert planned and planned[-1]["planned_end_s"] <= 540 and len(planned) < len(entries)
    assert entries[0]["cell"] == {"task": "listops", "n": 512, "mechanism": "dense", "seed": 0, "steps": None}
    assert "planned" in capsys.readouterr().out
    # Budget logic with a fake clock: each cell "takes" 2x its estimate, so later ones stop fitting.
    now = [0.0]
    calls = []
    fake = _fake_run(calls)

    def slow_run(argv, timeout_s):
        now[0] += min(2 * 40.0, timeout_s)
        return fake(argv, timeout_s)

    cells = [Cell("dyck", 64, a, 0) for a in ("dense", "local", "abca", "labels")]
    records = gpu_classify.run_budget(cells, config="smoke", steps=3, budget_s=200, reserve_s=20, out=str(tmp_path),
                                      runs_dir=str(tmp_path / "runs"), estimate=lambda c, s: 40.0, run=slow_run,
                                      clock=lambda: now[0], **QUIET)
    assert [r["status"] for r in records] == ["finished", "finished", "skipped (does not fit)",
                                              "skipped (does not fit)"]
    assert records[1]["estimate_s"] == 80.0  # rescaled by the first cell's measured/estimated = 2
    assert all(limit <= r["left_s"] for (_, limit), r in zip(calls, records, strict=False))
    assert [json.loads(x)["status"] for x in (tmp_path / "status.jsonl").read_text().splitlines()] == [
        r["status"] for r in records]
    assert json.loads((tmp_path / "plan.json").read_text())["plan"][0]["planned"]
    assert len((tmp_path / "dyck.jsonl").read_text().splitlines()) == 2


def test_gpu_cell_subprocess_is_stopped_at_its_limit(tmp_path):
    """A real subprocess past its limit (the time left: 2 s, below JAX's start and compile) gets SIGTERM and
    counts as timed out, leaving no row."""
    records = gpu_classify.run_budget(
        [Cell("dyck", 64, "dense", 0)], config="smoke", steps=4, budget_s=2, reserve_s=0, out=str(tmp_path),
        runs_dir=str(tmp_path / "runs"), estimate=lambda c, s: 0.5,
        run=lambda argv, t: gpu_classify.run_subprocess(argv, t, grace_s=5), **QUIET)
    assert records[0]["status"] == "timed out (rerun to resume)" and records[0]["limit_s"] <= 2.0
    assert records[0]["seconds"] < 10 and not (tmp_path / "dyck.jsonl").exists()


def test_padded_pathfinder_is_pathfinder_plus_padding():
    task = make_task("pathfinder", 128, num_train=8, num_validation=4)
    assert (task.size, task.seq_len, task.pad_to) == (11, 128, 128)
    ex = task.example(np.random.default_rng(5))
    plain = Pathfinder(size=11).example(np.random.default_rng(5))
    assert ex["inputs"].shape == (128,) and ex["valid_len"] == 121 and not ex["inputs"][121:].any()
    assert (ex["inputs"][:121] == plain["inputs"]).all() and ex["label"] == plain["label"]
    assert task.source("validation")[3]["inputs"].shape == (128,)
    assert make_task("pathfinder", 512, num_train=8, num_validation=4).size == 22
    with pytest.raises(ValueError, match="size\\*\\*2"):
        make_task("pathfinder", 1000, num_train=8, num_validation=4)
