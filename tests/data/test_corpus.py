"""Byte corpora: the embedded stdlib corpus, user text files/folders, the by-file split."""

import numpy as np
import pytest

from sparse_attn.data import corpus


def test_stdlib_corpus_split_is_by_file_disjoint_and_deterministic():
    a = corpus.stdlib_corpus(valid_fraction=0.1)
    b = corpus.stdlib_corpus(valid_fraction=0.1)
    assert a.train_files == b.train_files and a.valid_files == b.valid_files
    np.testing.assert_array_equal(a.valid_U8, b.valid_U8)
    assert not set(a.train_files) & set(a.valid_files)
    files = a.train_files + a.valid_files
    assert all(f.endswith(".py") for f in files)
    parts = {p for f in files for p in f.split("/")[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages"}, parts & {"test", "tests"}
    # ~10% of files by hash; the corpus is megabytes, not a handful of files.
    assert 0.05 < len(a.valid_files) / len(files) < 0.15
    assert a.train_U8.size > 5_000_000 and a.valid_U8.size > 200_000
    # One separator between consecutive files, none inside them.
    assert int((a.valid_U8 == 0).sum()) == len(a.valid_files) - 1
    assert a.train_U8.dtype == np.uint8


def test_split_depends_only_on_the_path():
    paths = [f"pkg/mod_{i}.py" for i in range(200)]
    in_valid = {p: corpus.is_validation_file(p, 0.2) for p in paths}
    # Dropping half the files does not move any other file across the split.
    assert all(corpus.is_validation_file(p, 0.2) == in_valid[p] for p in paths[::2])
    assert 20 < sum(in_valid.values()) < 60


def test_text_corpus_from_a_file(tmp_path):
    path = tmp_path / "book.txt"
    path.write_bytes(b"abcdefghij" * 10)
    c = corpus.text_corpus(path, valid_fraction=0.2)
    assert c.train_U8.tobytes() + c.valid_U8.tobytes() == b"abcdefghij" * 10
    assert c.valid_U8.size == 20


def test_text_corpus_from_a_folder_splits_by_file(tmp_path):
    for i in range(40):
        (tmp_path / "sub").mkdir(exist_ok=True)
        (tmp_path / "sub" / f"doc{i}.txt").write_text(f"document {i}\n")
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    c = corpus.text_corpus(tmp_path, valid_fraction=0.25)
    assert len(c.train_files) + len(c.valid_files) == 40
    assert all(f.startswith("sub/") for f in c.train_files + c.valid_files)
    text = bytes(c.train_U8).split(b"\0") + bytes(c.valid_U8).split(b"\0")
    assert sorted(text) == sorted(f"document {i}\n".encode() for i in range(40))


def test_missing_path_error_names_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        corpus.text_corpus(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        corpus.text_corpus(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        corpus.stdlib_files(tmp_path / "nowhere")
