"""Dyck-(k, m): balance by an independent checker, counts preserved, the probe's distance, locality."""

import numpy as np
import pytest

from sparse_attn.data.tasks import Dyck, batch


def decode(tokens, k):
    """[(is_open, type)] of the non-pad tokens."""
    return [(t <= k, (t - 1) % k) for t in tokens.tolist() if t != 0]


def balanced(word, m=None) -> bool:
    stack = []
    for is_open, t in word:
        if is_open:
            stack.append(t)
            if m is not None and len(stack) > m:
                return False
        elif not stack or stack.pop() != t:
            return False
    return not stack


def factor_of_a_balanced_word(word) -> bool:
    """Closers with no opener inside the window may be of any type; matched pairs must agree."""
    stack = []
    for is_open, t in word:
        if is_open:
            stack.append(t)
        elif stack and stack.pop() != t:
            return False
    return True


def opener_of(word, j) -> int:
    depth = 0
    for i in range(j, -1, -1):
        depth += -1 if word[i][0] else 1
        if depth == 0:
            return i
    raise AssertionError("no opener")


@pytest.mark.parametrize("seq_len, count", [(128, 300), (512, 40), (2048, 6)])
def test_labels_counts_and_distance(seq_len, count):
    task = Dyck(seq_len=seq_len)
    out = batch(task.source("train"), range(count))
    lo, hi = task.length_band
    for inputs, label, valid_len, distance, position in zip(
            out["inputs"], out["label"], out["valid_len"], out["distance"], out["position"], strict=True):
        assert lo <= valid_len <= hi and valid_len % 2 == 0
        assert (inputs[:valid_len] != 0).all() and (inputs[valid_len:] == 0).all()
        word = decode(inputs, task.k)
        assert balanced(word, task.m) == bool(label)
        # the shape is a depth-<=m Dyck path in both classes, and every type's counts balance
        assert balanced([(o, 0) for o, _ in word], task.m)
        for t in range(task.k):
            assert sum(1 for o, s in word if o and s == t) == sum(1 for o, s in word if not o and s == t)
        assert not word[position][0]
        opener = opener_of(word, position)
        assert position - opener == distance >= task.min_distance
        assert (word[opener][1] == word[position][1]) == bool(label)
    if count >= 100:
        assert 0.4 < out["label"].mean() < 0.6


def test_corruption_is_invisible_to_windows_of_distance_tokens():
    task = Dyck(seq_len=128, min_distance=8)
    src = task.source("validation")
    seen = 0
    for i in range(40):
        ex = src[i]
        if ex["label"] == 1:
            continue
        seen += 1
        word = decode(ex["inputs"], task.k)
        d, a = int(ex["distance"]), int(ex["position"])
        assert all(factor_of_a_balanced_word(word[s:s + d]) for s in range(len(word) - d + 1))
        assert not factor_of_a_balanced_word(word[a - d:a + 1])
    assert seen >= 10


def test_uniform_shapes_of_bounded_height():
    from sparse_attn.data.tasks.dyck import sample_shape

    rng = np.random.default_rng(0)
    # Dyck paths of length 6 and height <= 2: ()()(), (())(), ()(()), (()()); ((())) is too deep.
    shapes = [tuple(sample_shape(rng, 6, 2).tolist()) for _ in range(4000)]
    values, counts = np.unique(np.array(shapes), axis=0, return_counts=True)
    assert len(values) == 4 and counts.min() > 900


def test_random_access_and_two_constructions_agree():
    a, b = Dyck(seq_len=128).source("train"), Dyck(seq_len=128).source("train")
    first = {i: a[i] for i in (5, 2, 9)}
    for i in (2, 5, 9):
        for key, value in b[i].items():
            np.testing.assert_array_equal(value, first[i][key])
    assert a.vocab_size == 17 and a.num_classes == 2
    with pytest.raises(ValueError, match="k >= 2"):
        Dyck(k=1)
