"""Digits (scikit-learn's bundled images) and the CIFAR-10 TFDS loader on tfds mock data (no download)."""

import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from sparse_attn.data.tasks import Cifar10, Digits, batch, patchify
from sparse_attn.data.tasks import digits as digits_module


def test_digits_splits_are_disjoint_complete_and_seeded():
    from sklearn.datasets import load_digits

    task = Digits()
    train, valid = task.source("train"), task.source("validation")
    assert (len(train), len(valid)) == (1438, 359)
    ids = np.concatenate([batch(train, range(len(train)))["image_id"], batch(valid, range(len(valid)))["image_id"]])
    assert sorted(ids.tolist()) == list(range(1797))
    d = load_digits()
    ex = valid[5]
    np.testing.assert_array_equal(ex["inputs"], 1 + d.images[ex["image_id"]].reshape(-1).astype(np.int32))
    assert ex["label"] == d.target[ex["image_id"]] and ex["inputs"].dtype == np.int32
    assert ex["inputs"].min() >= 1 and ex["inputs"].max() < task.vocab_size
    again = Digits().source("validation")
    np.testing.assert_array_equal(again[5]["inputs"], ex["inputs"])
    other = Digits(seed=1).source("validation")
    assert not np.array_equal(batch(other, range(20))["image_id"], batch(valid, range(20))["image_id"])
    counts = np.bincount(batch(train, range(len(train)))["label"], minlength=10)
    assert counts.min() > 100  # every class well represented in train
    with pytest.raises(ValueError, match="no test split"):
        task.source("test")


def test_digits_without_scikit_learn_names_the_extra(monkeypatch):
    digits_module.load_digits_arrays.cache_clear()
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    try:
        with pytest.raises(ImportError, match=r"sparse_attn\[tasks\]"):
            Digits().source("train")
    finally:
        digits_module.load_digits_arrays.cache_clear()


@pytest.mark.parametrize("grayscale", [True, False])
def test_cifar10_from_mock_data(grayscale):
    task = Cifar10(grayscale=grayscale)
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        src = task.source("train")
        raw = tfds.data_source("cifar10", split="train")[2]
        ex = src[2]
        assert len(src) == 4 and len(task.source("validation")) == 4
    rgb = raw["image"].astype(np.float64)
    expected = np.round(rgb @ [0.2989, 0.587, 0.114]) if grayscale else rgb
    np.testing.assert_array_equal(ex["inputs"], 1 + expected.reshape(-1).astype(np.int32))
    assert ex["inputs"].shape == (task.seq_len,) == ((1024,) if grayscale else (3072,))
    assert ex["label"] == raw["label"] and ex["inputs"].max() < task.vocab_size
    patches = patchify(ex["inputs"][None], height=32, width=32, channels=task.channels, patch=4, levels=256)
    assert patches.shape == (1, 64, 16 * task.channels)
    np.testing.assert_allclose(patches[0, 0, :task.channels], expected[0, 0].reshape(-1) / 255, rtol=1e-6)


def test_cifar10_missing_data_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="tfds build cifar10"):
        Cifar10(data_dir=str(tmp_path)).source("train")


def test_cifar10_without_tfds_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"sparse_attn\[data\]"):
        Cifar10().source("train")
