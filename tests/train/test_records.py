"""A work directory's records belong to the run that wrote them: a fresh start moves an earlier run's records
aside, a resume drops its own interrupted tail, so no reader mixes two runs' steps."""

import json
import os

import train_harness as tiny

from sparse_attn.train import read_metrics


def _fake_records(workdir: str, steps, loss: float) -> None:
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "split": "train", "loss": loss}) + "\n")


def test_a_fresh_run_moves_an_earlier_runs_records_aside(tmp_path):
    """An earlier run killed before its first checkpoint left steps 1-42 (another config, say); the new run's
    records hold its own steps only, and the earlier ones are kept aside."""
    workdir = str(tmp_path)
    _fake_records(workdir, range(1, 43), loss=123.0)
    logs = []
    tiny.run(workdir, tiny.config(num_steps=4), log=logs.append)
    assert sorted(read_metrics(workdir)) == [1, 2, 3, 4]
    assert all(r["loss"] != 123.0 for r in read_metrics(workdir).values())
    with open(os.path.join(workdir, "metrics.jsonl.earlier-1")) as f:
        assert len(f.readlines()) == 42
    assert any("metrics.jsonl moved to metrics.jsonl.earlier-1" in m for m in logs)


def test_a_resume_drops_its_interrupted_tail(tmp_path):
    """Checkpoints at 2 and 4, then records of steps 5-9 that no checkpoint holds (an interrupted tail): resumed
    to 6 steps, the records are steps 1-6, none of the old tail past 6 survives."""
    workdir = str(tmp_path)
    tiny.run(workdir, tiny.config(num_steps=4))
    _fake_records(workdir, range(5, 10), loss=123.0)
    tiny.run(workdir, tiny.config(num_steps=6), allowed_changes=["train.num_steps"])
    records = read_metrics(workdir)
    assert sorted(records) == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] != 123.0 for r in records.values())
