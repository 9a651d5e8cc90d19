"""The one-call GPU session: budget shares, stage limits (the whole process group), the archive, continuation
from committed rows, and `--unpack`. The stages here are a fake module; the real stages' argv is checked
against their own argument parsers."""

import argparse
import importlib
import json
import os
import tarfile
import textwrap
import time

import pytest

from experiments.gpu import session as gpu_session
from experiments.gpu.session import Stage

FAKE = textwrap.dedent("""
    import json, os, subprocess, sys, time
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "write":
        with open(os.path.join(out, "rows.jsonl"), "a") as f:
            f.write(json.dumps({"config": "full", "n": 1, "commit": os.environ["SPARSE_ATTN_COMMIT"]}) + "\\n")
        sys.exit(0)
    if mode == "hang":  # a cell left running in the stage's process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.path.join(out, "child.pid"), "w").write(str(child.pid))
        time.sleep(60)
    sys.exit(3)
""")


def _fake_stage(tmp_path, name, mode, seconds, merge=(), seeded=False):
    (tmp_path / "fake_stage.py").write_text(FAKE)
    return Stage(name, "fake_stage", seconds, 0.0, lambda d, s: [mode, d], merge=merge, seeded=seeded,
                 env=(("PYTHONPATH", str(tmp_path)),))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return False


def _session(tmp_path, stages, budget_s, results_dir):
    out = tmp_path / "out"
    records = gpu_session.run_session(stages, budget_s=budget_s, out=str(out), results_dir=str(results_dir),
                                      commit="abc1234", command="test", device=lambda: ("fake", "0"),
                                      log=lambda s: None)
    return out, records


def test_allot_shares_the_budget_less_the_archive_time():
    shares = gpu_session.allot(gpu_session.STAGES, 540)
    assert sum(shares.values()) == pytest.approx(540 - gpu_session.PACK_S)
    assert [s.name for s in gpu_session.STAGES] == list(shares)
    assert shares["lm"] > shares["tune"]


def test_stages_run_in_order_continue_committed_rows_and_pack(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    committed = {"config": "full", "n": 0}
    (results / "rows.jsonl").write_text(json.dumps({"config": "cpu", "n": 0}) + "\n" + json.dumps(committed) + "\n")
    stages = [_fake_stage(tmp_path, "a", "write", 100, merge=("rows.jsonl",), seeded=True),
              _fake_stage(tmp_path, "b", "fail", 100)]
    out, records = _session(tmp_path, stages, budget_s=60 + gpu_session.PACK_S, results_dir=results)

    assert [(r["stage"], r["status"], r["seeded_rows"]) for r in records] == [("a", "ok", 1), ("b", "exit 3", 0)]
    # the unused part of a's share goes to b
    assert records[1]["allotted_s"] > 30 + 0.5 * (30 - records[0]["took_s"])
    assert sorted(os.listdir(out)) == ["gpu_session.log", "gpu_session.md", "gpu_session.tar.gz"]
    with tarfile.open(out / "gpu_session.tar.gz") as tar:
        rows = tar.extractfile("gpu_session/a/rows.jsonl").read().decode().splitlines()
        session = json.load(tar.extractfile("gpu_session/session.json"))
    assert json.loads(rows[0]) == committed  # only the full-scale row was carried in
    assert json.loads(rows[1])["commit"] == "abc1234"  # the stage saw the session's commit
    assert [s["stage"] for s in session["stages"]] == ["a", "b"]
    assert "| b |" in (out / "gpu_session.md").read_text()

    # unpack appends the new line only, and nothing on a second unpack
    stage_a = stages[0]
    assert gpu_session.unpack(str(out / "gpu_session.tar.gz"), str(results), [stage_a], log=lambda s: None) == {
        "rows.jsonl": 1}
    assert gpu_session.unpack(str(out / "gpu_session.tar.gz"), str(results), [stage_a], log=lambda s: None) == {
        "rows.jsonl": 0}
    assert len((results / "rows.jsonl").read_text().splitlines()) == 3
    assert (results / "gpu_session.json").exists()


def test_unpack_refuses_a_rehearsal(tmp_path):
    stage = _fake_stage(tmp_path, "a", "write", 100, merge=("rows.jsonl",))
    out = tmp_path / "out"
    gpu_session.run_session([stage], budget_s=30 + gpu_session.PACK_S, out=str(out), results_dir=str(tmp_path),
                            commit="x", rehearse=True, device=lambda: ("cpu", "0"), log=lambda s: None)
    with pytest.raises(ValueError, match="rehearse"):
        gpu_session.unpack(str(out / "gpu_session.tar.gz"), str(tmp_path), [stage])
    assert not (tmp_path / "rows.jsonl").exists()


def test_a_stage_past_its_limit_is_killed_with_its_children(tmp_path):
    stages = [_fake_stage(tmp_path, "slow", "hang", 100)]
    # a 1 s allotment is below the 10 s a stage needs to start: skipped, not run
    records = _session(tmp_path, stages, budget_s=1 + gpu_session.PACK_S, results_dir=tmp_path)[1]
    assert records[0]["status"] == "skipped (no time left)"

    with open(tmp_path / "log", "w") as log_file:
        t0 = time.monotonic()
        stage_dir = tmp_path / "stage"
        stage_dir.mkdir()
        rc, took = gpu_session.run_stage(["fake_stage", "hang", str(stage_dir)], 3.0, log_file,
                                         dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert rc == 124 and 3.0 <= took < 15 and time.monotonic() - t0 < 15
    child = int((stage_dir / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


class _Parsed(Exception):
    pass


@pytest.mark.parametrize("rehearse", [False, True], ids=["gpu", "rehearse"])
@pytest.mark.parametrize("stage", gpu_session.STAGES, ids=lambda s: s.name)
def test_real_stage_arguments_parse(stage, rehearse, monkeypatch, tmp_path):
    """Each stage's argv, as the session builds it, is accepted by that script's own parser."""
    seen = {}
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        seen["args"] = original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    module = importlib.import_module(stage.module)
    if not hasattr(module, "main"):  # a study package: `python -m` runs its __main__
        module = importlib.import_module(stage.module + ".__main__")
    with pytest.raises(_Parsed):
        module.main(stage.argv(str(tmp_path), 100.0) + list(stage.rehearse if rehearse else ()))
    assert seen["args"] is not None


def test_plan_and_bad_stage_names(capsys):
    gpu_session.main(["--plan", "--budget", "300", "--stages", "lm,check"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["lm", "check"]
    with pytest.raises(SystemExit):
        gpu_session.main(["--plan", "--stages", "lm,kernels"])


def test_rows_name_the_commit_passed_in(monkeypatch):
    """A device's copy of the tree has no git: every script's rows take $SPARSE_ATTN_COMMIT."""
    from sparse_attn.studies.runs import git_commit

    monkeypatch.setenv("SPARSE_ATTN_COMMIT", "feed123")
    assert git_commit() == "feed123"


@pytest.mark.parametrize("name, config", [("lm", "gpu_tiny"), ("retrieval", "smoke")])
def test_rehearsed_stage_writes_the_rows_the_session_merges(tmp_path, name, config):
    """The real LM and retrieval stages in their CPU modes, through the session: their rows land in the file
    `merge` names, with the session's commit."""
    stage = next(s for s in gpu_session.STAGES if s.name == name)
    out, records = _session_rehearsal(tmp_path, [stage], budget_s=200)
    assert records[0]["status"] == "ok"
    with tarfile.open(out / "gpu_session.tar.gz") as tar:
        rows = [json.loads(line) for file in stage.merge
                for line in tar.extractfile(f"gpu_session/{name}/{file}").read().decode().splitlines()]
    assert [(r["config"], r["mechanism"], r["commit"]) for r in rows] == [
        (config, "dense", "rehearsal"), (config, "local", "rehearsal")]


def _session_rehearsal(tmp_path, stages, budget_s):
    out = tmp_path / "out"
    records = gpu_session.run_session(stages, budget_s=budget_s, out=str(out), results_dir=str(tmp_path),
                                      commit="rehearsal", rehearse=True, log=lambda s: None)
    return out, records
