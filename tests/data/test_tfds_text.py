"""TFDS text loader on tfds mock data (no download, no TensorFlow)."""

import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from sparse_attn.data import tfds_text


def test_mock_tiny_shakespeare_becomes_a_byte_corpus():
    with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
        c = tfds_text.tfds_text_corpus("tiny_shakespeare", valid_split="validation")
        expected = [tfds.data_source("tiny_shakespeare", split="train")[i]["text"] for i in range(5)]
    joined = b"\0".join(t.encode() if isinstance(t, str) else t for t in expected)
    assert bytes(c.train_U8) == joined
    assert c.valid_U8.size > 0 and c.valid_U8.dtype == np.uint8
    assert c.train_files == ("tiny_shakespeare:train[5 examples]",)


def test_max_examples_limits_each_split():
    with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
        c = tfds_text.tfds_text_corpus("tiny_shakespeare", max_examples=2)
    assert int((c.train_U8 == 0).sum()) == 1


def test_missing_extra_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"sparse_attn\[data\]"):
        tfds_text.tfds_text_corpus("tiny_shakespeare")
