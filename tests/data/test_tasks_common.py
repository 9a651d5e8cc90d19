"""The task protocol: batching, epoch-shuffled resumable batch order, evaluation batches, patches."""

import numpy as np
import pytest

from sparse_attn.data.tasks import Dyck, Pathfinder, TaskBatches, batch, batch_indices, eval_batches, patchify


def small_source(n=10):
    return Dyck(seq_len=32, min_distance=3, num_train=n).source("train")


def test_batch_order_visits_every_example_once_per_epoch():
    idx = np.concatenate([batch_indices(10, global_batch=4, seed=0, step=t) for t in range(5)])
    assert sorted(idx[:10].tolist()) == list(range(10)) and sorted(idx[10:20].tolist()) == list(range(10))
    assert not np.array_equal(idx[:10], idx[10:20])  # reshuffled per epoch


def test_resume_from_state_reproduces_the_batches():
    src = small_source()
    it = TaskBatches(src, global_batch=4, seed=7)
    run = [next(it) for _ in range(5)]
    resumed = TaskBatches(small_source(), global_batch=4, seed=7)
    resumed.set_state({"seed": 7, "step": 3})
    for b in run[3:]:
        got = next(resumed)
        for key in b:
            np.testing.assert_array_equal(got[key], b[key])
    assert resumed.get_state() == {"seed": 7, "step": 5}
    with pytest.raises(ValueError, match="seed"):
        resumed.set_state({"seed": 8, "step": 0})


def test_processes_take_their_rows_of_the_global_batch():
    src = small_source()
    whole = next(TaskBatches(src, global_batch=4, seed=1))
    halves = [next(TaskBatches(src, global_batch=4, seed=1, process_index=p, process_count=2)) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([h["inputs"] for h in halves]), whole["inputs"])
    with pytest.raises(ValueError, match="divisible"):
        TaskBatches(src, global_batch=3, seed=1, process_count=2)


def test_eval_batches_cover_the_split_in_order_with_weights():
    src = small_source()
    batches = list(eval_batches(src, global_batch=4))
    assert [b["weight"].tolist() for b in batches] == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
    np.testing.assert_array_equal(batches[1]["label"], batch(src, [4, 5, 6, 7])["label"])
    assert batches[0]["inputs"].shape == (4, 32) and batches[0]["inputs"].dtype == np.int32


def test_patchify_orders_patches_row_major():
    img = np.arange(16).reshape(4, 4)
    patches = patchify(1 + img.reshape(1, 16), height=4, width=4, patch=2, levels=16)
    np.testing.assert_allclose(patches[0] * 15, [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]])
    with pytest.raises(ValueError, match="patches"):
        patchify(np.ones((1, 15), np.int32), height=4, width=4, patch=2, levels=16)


def test_tasks_sharing_a_seed_draw_independent_labels():
    dyck = batch(Dyck(seq_len=32, min_distance=3).source("train"), range(40))["label"]
    path = batch(Pathfinder(size=16).source("train"), range(40))["label"]
    assert 0.3 < np.mean(dyck == path) < 0.7


def test_stats_script_prints_one_row_per_task(capsys):
    from sparse_attn.data.tasks import stats

    assert stats.best_threshold_accuracy(np.array([1, 2, 3, 4]), np.array([1, 1, 0, 0])) == 1.0
    assert stats.best_threshold_accuracy(np.array([1, 1, 1, 1]), np.array([1, 0, 1, 0])) == 0.5
    stats.main(["--num", "3"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 2 + 4 + 3 + 2 and all(r.startswith("| ") for r in rows)
