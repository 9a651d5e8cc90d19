"""Every `python -m experiments....` command speaks to people: `--help` shows what it runs and what it writes, and a
bad argument or a missing work directory is one line on stderr, exit status 2, no traceback."""

import importlib
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import experiments

ROOT = pathlib.Path(__file__).parents[2]


def _entry_points() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(experiments.__path__, "experiments."):
        path = ROOT / (info.name.replace(".", "/") + ("/__init__.py" if info.ispkg else ".py"))
        if not info.ispkg and not info.name.endswith("__main__") and '__name__ == "__main__"' in path.read_text():
            names.append(info.name)
    return sorted(names)


ENTRY_POINTS = _entry_points()
REQUIRED = {"experiments.lm.label_phase_switch": ["--checkpoint", "1", "--steps", "1", "--batches", "0", "1",
                                                 "--out", "x.json"]}
WORKDIR_TAKERS = ("experiments.evaluate", "experiments.generate", "experiments.lm.label_capacity",
                  "experiments.lm.label_phase_switch", "experiments.retrieval.diagnose")


def test_every_study_is_an_entry_point():
    for name in ("experiments.lm.train", "experiments.retrieval.train", "experiments.classification.train",
                 "experiments.gpu.session", "experiments.reports.results", "experiments.benchmarks.attention",
                 *WORKDIR_TAKERS):
        assert name in ENTRY_POINTS


def _exit(name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m name argv`, run in-process."""
    with pytest.raises(SystemExit) as info:
        importlib.import_module(name).main(argv)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_and_a_bad_argument(name, capsys):
    """--help: the docstring (what it runs) with its Writes: line; an unknown flag: one line, exit status 2."""
    code, out, _ = _exit(name, ["--help"], capsys)
    first_line = importlib.import_module(name).__doc__.strip().splitlines()[0]
    assert code == 0 and first_line in out and "Writes:" in out, out
    code, _, err = _exit(name, ["--no_such_flag"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"python -m {name}: error: "), err


@pytest.mark.parametrize("name", WORKDIR_TAKERS)
def test_a_missing_workdir_is_one_line_naming_it(name, capsys, tmp_path):
    missing = str(tmp_path / "no_such_run")
    code, _, err = _exit(name, ["--workdir", missing, *REQUIRED.get(name, [])], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and missing in err, err


# A name or value the script does not know: one line naming it and what is allowed, before anything runs.
BAD_ARGUMENTS = [
    ("experiments.lm.train", ["--workdir", "{tmp}/w", "--mechanism", "nosuch"], "choose from dense, local"),
    ("experiments.lm.grid", ["--workdir", "{tmp}/w", "--mechanism", "nosuch"], "choose from dense, local"),
    ("experiments.retrieval.train", ["--workdir", "{tmp}/w", "--mechanism", "nosuch"], "choose from dense, local"),
    ("experiments.classification.train", ["--workdir", "{tmp}/w", "--task", "dyck", "--n", "64",
                                          "--mechanism", "nosuch"], "choose from dense, local"),
    ("experiments.classification.grid", ["--grid", "cpu", "--dry_run", "--task", "nosuch"],
     "choose from dyck, listops, pathfinder"),
    ("experiments.classification.grid", ["--grid", "cpu", "--dry_run", "--only", "dense,nosuch"], "choose from abca"),
    ("experiments.classification.grid", ["--grid", "cpu", "--dry_run", "--deadline", "nosuch"], "HH:MM"),
    ("experiments.classification.router_warm_start", ["--arms", "nosuch"], "choose from 'cold'"),
    ("experiments.lm.label_phase_switch", ["--workdir", "{tmp}", *REQUIRED["experiments.lm.label_phase_switch"],
                                           "--config", "nosuch"], "choose from 'base'"),
    ("experiments.lm.label_phase_switch", ["--workdir", "{tmp}", *REQUIRED["experiments.lm.label_phase_switch"],
                                           "--label", "nosuch"], "KEY=VALUE"),
    ("experiments.lm.label_phase_switch", ["--workdir", "{tmp}", *REQUIRED["experiments.lm.label_phase_switch"],
                                           "--label", "nosuch=1"], "has no field nosuch"),
    ("experiments.lm.label_phase_switch", ["--workdir", "{tmp}", *REQUIRED["experiments.lm.label_phase_switch"]],
     "no checkpoints/ directory"),
    ("experiments.lm.label_phase_switch", ["--workdir", "{tmp}/run", *REQUIRED["experiments.lm.label_phase_switch"]],
     "no checkpoint step 1"),
    ("experiments.lm.label_capacity", ["--workdir", "{tmp}", "--batches", "0"], "--batches must be >= 1"),
    ("experiments.benchmarks.decode", ["--mechanisms", "dense,nosuch"], "choose from dense, local"),
    ("experiments.benchmarks.decode", ["--lengths", "nosuch"], "--lengths"),
    ("experiments.benchmarks.lm_step", ["--mechanisms", "nosuch"], "choose from dense, local"),
    ("experiments.benchmarks.lm_step", ["--impls", "nosuch"], "choose from default, reference"),
    ("experiments.benchmarks.shared_patterns", ["--mechanisms", "nosuch"], "choose from dense, local"),
    ("experiments.benchmarks.attention", ["--dtype", "nosuch"], "choose from 'float32'"),
    ("experiments.benchmarks.noncrossing", ["--routers", "nosuch"], "choose from 'defect_pair'"),
]


def _last_flag(argv: list[str]) -> str:
    return next(a for a in reversed(argv) if a.startswith("--"))


@pytest.mark.parametrize("name,argv,allowed", BAD_ARGUMENTS, ids=[f"{n}:{_last_flag(a)}" for n, a, _ in BAD_ARGUMENTS])
def test_a_bad_name_is_one_line_naming_it_and_what_is_allowed(name, argv, allowed, capsys, tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run without the step asked for
    code, _, err = _exit(name, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and allowed in err, err
    assert err.startswith(f"python -m {name}: error: "), err
    assert "nosuch" in err or "nosuch" not in " ".join(argv), err  # the bad value itself is named


def test_the_command_line_prints_one_line_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.generate", "--workdir", str(tmp_path / "missing")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip().splitlines() == [f"python -m experiments.generate: error: "
                                                f"{proc.stderr.split('error: ', 1)[1].strip()}"]
    assert str(tmp_path / "missing") in proc.stderr


def test_a_locked_workdir_and_a_bad_batch_count_are_one_line(tmp_path, capsys):
    """An environment problem (another run holds the work directory): one line, exit status 1; a count below 1:
    the parser's one line naming the flag, exit status 2."""
    from sparse_attn.train import workdir_lock

    with workdir_lock.hold(str(tmp_path)):
        code, _, err = _exit("experiments.lm.train", ["--workdir", str(tmp_path), "--num_steps", "1"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "in use by another run" in err, err
    code, _, err = _exit("experiments.evaluate", ["--workdir", str(tmp_path), "--max_batches", "-3"], capsys)
    assert code == 2 and "--max_batches" in err and "integer >= 1" in err, err


def test_a_full_disk_is_one_line_even_when_a_library_wraps_it(capsys):
    """An OSError of the disk (full, read-only, forbidden) found anywhere in the cause chain: one line, status 1;
    any other exception keeps its traceback."""
    import errno  # noqa: PLC0415

    from sparse_attn.studies import cli  # noqa: PLC0415

    @cli.entry_point
    def main(argv=None):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("orbax: a background write failed") from e

    with pytest.raises(SystemExit) as info:
        main([])
    err = capsys.readouterr().err
    assert info.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "background write failed" in err and "No space left on device" in err, err

    @cli.entry_point
    def buggy(argv=None):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        buggy([])


def test_usage_names_the_package_the_user_ran(monkeypatch):
    """`python -m experiments.lm` runs experiments.lm.train: its usage and errors name experiments.lm."""
    import importlib.machinery
    import types

    from sparse_attn.studies import cli

    fake = types.ModuleType("__main__")
    fake.__spec__ = importlib.machinery.ModuleSpec("experiments.lm.__main__", None)
    monkeypatch.setitem(sys.modules, "__main__", fake)
    train = {"__spec__": importlib.machinery.ModuleSpec("experiments.lm.train", None)}
    assert cli._prog_of(train) == "python -m experiments.lm"
    other = {"__spec__": importlib.machinery.ModuleSpec("experiments.evaluate", None)}
    assert cli._prog_of(other) == "python -m experiments.evaluate"
