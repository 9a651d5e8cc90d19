"""Batch iterators: determinism from the seed, O(1) resume, per-process rows of one global batch."""

import json

import numpy as np
import pytest

from sparse_attn.data import RandomWindows, eval_batches

TOKENS = np.arange(1000, dtype=np.int64).astype(np.uint8)  # position is recoverable mod 256


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_batches_are_shifted_windows():
    (batch,) = _take(RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=0), 1)
    assert batch["inputs"].shape == (4, 8) and batch["inputs"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    np.testing.assert_array_equal((batch["inputs"][:, 1:] - batch["inputs"][:, :-1]) % 256, 1)


def test_same_seed_same_batches_other_seed_other_batches():
    a = _take(RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=1), 5)
    b = _take(RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=1), 5)
    c = _take(RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=2), 5)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
    assert any((x["inputs"] != z["inputs"]).any() for x, z in zip(a, c, strict=True))


def test_resume_from_json_state_continues_the_stream():
    full = _take(RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=3), 7)
    it = RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=3)
    _take(it, 4)
    state = json.loads(json.dumps(it.get_state()))
    resumed = RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=3)
    resumed.set_state(state)
    for x, y in zip(full[4:], _take(resumed, 3), strict=True):
        np.testing.assert_array_equal(x["targets"], y["targets"])
    with pytest.raises(ValueError, match="seed"):
        RandomWindows(TOKENS, global_batch=4, seq_len=8, seed=4).set_state(state)


def test_processes_get_disjoint_rows_of_the_same_global_batch():
    (whole,) = _take(RandomWindows(TOKENS, global_batch=6, seq_len=8, seed=5), 1)
    parts = [next(RandomWindows(TOKENS, global_batch=6, seq_len=8, seed=5, process_index=i, process_count=3))
             for i in range(3)]
    np.testing.assert_array_equal(np.concatenate([p["inputs"] for p in parts]), whole["inputs"])
    with pytest.raises(ValueError, match="divisible"):
        RandomWindows(TOKENS, global_batch=5, seq_len=8, seed=5, process_count=2)


def test_eval_batches_are_fixed_and_cover_the_set():
    a = list(eval_batches(TOKENS, global_batch=4, seq_len=8, num_batches=3))
    b = list(eval_batches(TOKENS, global_batch=4, seq_len=8, num_batches=3))
    assert len(a) == 3
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
    starts = np.concatenate([x["inputs"][:, 0] for x in a]).astype(np.int64)
    assert starts[0] == 0 and starts[-1] == (1000 - 9) % 256  # spans the whole set
    halves = [list(eval_batches(TOKENS, global_batch=4, seq_len=8, num_batches=3, process_index=i,
                                process_count=2)) for i in range(2)]
    for whole, p0, p1 in zip(a, *halves, strict=True):
        np.testing.assert_array_equal(np.concatenate([p0["inputs"], p1["inputs"]]), whole["inputs"])


def test_too_short_corpus_is_an_error():
    with pytest.raises(ValueError, match="shorter"):
        RandomWindows(TOKENS[:5], global_batch=1, seq_len=8, seed=0)
