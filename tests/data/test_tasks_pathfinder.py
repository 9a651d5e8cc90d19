"""Pathfinder: the label equals connectivity of the two dots by an independent flood fill."""

import numpy as np
import pytest

from sparse_attn.data.tasks import Pathfinder, batch
from sparse_attn.data.tasks.pathfinder import BACKGROUND, DOT


def dilate(mask):
    padded = np.pad(mask, 1)
    h, w = mask.shape
    return np.logical_or.reduce([padded[i:i + h, j:j + w] for i in range(3) for j in range(3)])


def flood(mask, seed):
    """Pixels of `mask` 8-connected to the `seed` pixels (repeated dilation; not the generator's BFS)."""
    reach = seed & mask
    while True:
        grown = dilate(reach) & mask
        if (grown == reach).all():
            return reach
        reach = grown


def count_blobs(mask):
    n, left = 0, mask.copy()
    while left.any():
        seed = np.zeros_like(left)
        seed[tuple(np.argwhere(left)[0])] = True
        left &= ~flood(left, seed)
        n += 1
    return n


@pytest.mark.parametrize("size, count", [(32, 150), (64, 30)])
def test_label_is_connectivity_of_the_dots(size, count):
    task = Pathfinder(size=size)
    out = batch(task.source("train"), range(count))
    assert out["inputs"].shape == (count, size * size) and (out["valid_len"] == size * size).all()
    _, num_distractors, _ = task.lengths
    for inputs, label in zip(out["inputs"], out["label"], strict=True):
        image = inputs.reshape(size, size)
        assert set(np.unique(image)) == {1, 2, 3}
        dots = image == DOT
        assert dots.sum() == 18 and count_blobs(dots) == 2  # two separate 3x3 dots
        ink = image != BACKGROUND
        first = np.zeros_like(dots)
        first[tuple(np.argwhere(dots)[0])] = True
        first_dot = flood(dots, first)
        other_dot = dots & ~first_dot
        assert (flood(ink, first_dot) & other_dot).any() == bool(label)
        assert count_blobs(ink) == 2 + num_distractors
    if count >= 100:
        assert 0.4 < out["label"].mean() < 0.6
        ink = (out["inputs"] != BACKGROUND).sum(1)
        pos, neg = ink[out["label"] == 1].mean(), ink[out["label"] == 0].mean()
        assert abs(pos - neg) < 0.05 * pos  # same paths in both classes: no pixel-count shortcut


def test_random_access_and_two_constructions_agree():
    a, b = Pathfinder(size=32).source("test"), Pathfinder(size=32).source("test")
    first = {i: a[i] for i in (4, 1, 6)}
    for i in (1, 4, 6):
        for key, value in b[i].items():
            np.testing.assert_array_equal(value, first[i][key])
    assert a.seq_len == 1024 and a.vocab_size == 4 and a.num_classes == 2
    assert not np.array_equal(a[0]["inputs"], Pathfinder(size=32, seed=3).source("test")[0]["inputs"])
