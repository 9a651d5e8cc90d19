"""Retrieval generators: answers recoverable by a direct lookup, distance bookkeeping, determinism, bad configs."""

import re

import numpy as np
import pytest

from sparse_attn.data.tasks import retrieval
from sparse_attn.data.tasks.retrieval import AssociativeRecall, Passkey


def _lookup_recall(task: AssociativeRecall, inputs: np.ndarray, targets: np.ndarray):
    """An independent evaluator: for each token after the query marker that is a key, the value that followed
    that key's occurrence before the marker, and how far back that occurrence is."""
    marker = int(np.flatnonzero(inputs == retrieval.QUERY_ID)[0])
    stream = np.append(inputs, targets[-1])
    out = []
    for t in range(marker + 1, task.seq_len):
        if task.key_offset <= inputs[t] < task.value_offset:
            (where,) = np.flatnonzero(inputs[:marker] == inputs[t])  # exactly one: keys are distinct
            out.append((t, int(stream[where + 1]), t - int(where)))
    return out


@pytest.mark.parametrize("seq_len", [64, 1024])
def test_recall_answers_are_found_by_lookup(seq_len):
    task = AssociativeRecall(seq_len=seq_len, num_pairs=8, num_queries=5, num_keys=16, num_values=8)
    src = task.source("validation")
    for i in range(20):
        e = src[i]
        np.testing.assert_array_equal(e["inputs"][1:], e["targets"][:-1])
        found = _lookup_recall(task, e["inputs"], e["targets"])
        assert [t for t, _, _ in found] == e["answer_pos"].tolist() == np.flatnonzero(e["loss_mask"]).tolist()
        assert [v for _, v, _ in found] == e["answer"].tolist() == e["targets"][e["answer_pos"]].tolist()
        assert [d for _, _, d in found] == e["distance"].tolist()
        ctx = e["inputs"][: seq_len - 2 * task.num_queries]
        assert np.all((ctx >= 2) & (ctx < task.vocab_size)) and np.all(e["inputs"] > 0)
        # every pair is in the context, filler never looks like a key or value
        assert np.sum((ctx >= task.key_offset) & (ctx < task.value_offset)) == task.num_pairs


def test_recall_distances_cover_the_context():
    task = AssociativeRecall(seq_len=512, num_pairs=16, num_queries=8)
    d = np.concatenate([task.source("train")[i]["distance"] for i in range(200)])
    assert d.min() < 64 and d.max() > 448  # pairs are spread uniformly over the context


@pytest.mark.parametrize("seq_len", [256, 4096])
def test_passkey_answer_is_found_by_lookup(seq_len):
    src = Passkey(seq_len=seq_len).source("train")
    depths = []
    for i in range(10):
        e = src[i]
        text = bytes(np.append(e["inputs"], e["targets"][-1]).astype(np.uint8))
        assert text.count(b"The pass key is ") == 2  # the needle and the question
        m = re.search(rb"The pass key is (\d{5})\. Remember it\. \1 is the pass key\.", text)
        asked = re.search(rb"What is the pass key\? The pass key is (\d{5})$", text)
        assert m and asked and m.group(1) == asked.group(1)
        assert bytes(e["answer"].astype(np.uint8)) == m.group(1)
        assert e["answer_pos"].tolist() == np.flatnonzero(e["loss_mask"]).tolist()
        assert e["targets"][e["answer_pos"]].tolist() == e["answer"].tolist()
        np.testing.assert_array_equal(e["answer_pos"] - e["distance"], m.start(1) + np.arange(5))
        depths.append(int(e["depth_permille"]))
    assert max(depths) - min(depths) > 300


def test_passkey_depth_is_placed():
    for depth in (0.0, 0.5, 1.0):
        e = Passkey(seq_len=2048, depths=(depth,)).source("test")[0]
        assert abs(int(e["depth_permille"]) - 1000 * depth) < 60  # snapped to a filler sentence start


def test_sources_are_deterministic_and_split_dependent():
    for task in (AssociativeRecall(seq_len=128, num_pairs=8, num_queries=4), Passkey(seq_len=128)):
        a, b = task.source("train"), task.source("train")
        for i in (5, 0, 5):
            for k, v in a[i].items():
                np.testing.assert_array_equal(v, b[i][k])
        assert not np.array_equal(a[0]["inputs"], task.source("validation")[0]["inputs"])
        assert not np.array_equal(a[0]["inputs"], a[1]["inputs"])
        assert a[-1]["inputs"].shape == (128,) and all(v.dtype == np.int32 for v in a[0].values())


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="num_queries"):
        AssociativeRecall(num_pairs=4, num_queries=8)
    with pytest.raises(ValueError, match="seq_len"):
        AssociativeRecall(seq_len=16, num_pairs=8, num_queries=4)
    with pytest.raises(ValueError, match="seq_len"):
        Passkey(seq_len=40)
    with pytest.raises(ValueError, match="depths"):
        Passkey(depths=(1.5,))
    with pytest.raises(ValueError, match="split"):
        Passkey().source("dev")
