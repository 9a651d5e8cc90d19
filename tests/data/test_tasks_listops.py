"""ListOps: answers checked by an independent stack evaluator (LRA's formulas), lengths, depth, determinism."""

import numpy as np
import pytest

from sparse_attn.data.tasks import ListOps, batch
from sparse_attn.data.tasks.listops import TOKENS, decode


def lra_value(op: str, args: list[int]) -> int:
    # LRA's `to_value` (lra_benchmarks/data/listops.py), written the way it computes.
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(np.median(args))
    assert op == "[SM", op
    return int(np.sum(args) % 10)


def evaluate(text: str) -> tuple[int, int, int]:
    """Stack machine over the token text: (value, max operator nesting, max argument count)."""
    stack, result, deepest, widest = [], None, 0, 0
    for tok in text.split():
        if tok.startswith("["):
            stack.append((tok, []))
            deepest = max(deepest, len(stack))
        elif tok == "]":
            op, args = stack.pop()
            widest = max(widest, len(args))
            assert len(args) >= 2, text
            value = lra_value(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                assert result is None, "two roots"
                result = value
        else:
            assert stack, "a digit outside any operator"
            stack[-1][1].append(int(tok))
    assert not stack and result is not None
    return result, deepest, widest


@pytest.mark.parametrize("seq_len, count", [(128, 300), (512, 60), (2048, 8)])
def test_answers_lengths_and_shape_match_the_definition(seq_len, count):
    task = ListOps(seq_len=seq_len)
    out = batch(task.source("train"), range(count))
    lo, hi = seq_len // 2, seq_len
    for inputs, label, valid_len, depth in zip(
            out["inputs"], out["label"], out["valid_len"], out["depth"], strict=True):
        assert inputs.dtype == np.int32 and inputs.shape == (seq_len,)
        assert lo <= valid_len <= hi
        assert (inputs[:valid_len] != 0).all() and (inputs[valid_len:] == 0).all()
        value, nesting, widest = evaluate(decode(inputs))
        assert value == label
        assert nesting == depth <= task.max_depth - 1
        assert widest <= task.max_args
    if seq_len == 128:  # every class occurs; the majority class stays small (LRA: ~17%)
        counts = np.bincount(out["label"], minlength=10)
        assert counts.min() > 0 and counts.max() / count < 0.3


def test_lra_band_and_vocabulary():
    task = ListOps.lra(num_train=4)
    assert task.seq_len == 2048 and task.length_band == (501, 1999)
    src = task.source("validation")
    for i in range(2):
        assert 501 <= src[i]["valid_len"] <= 1999
    assert task.vocab_size == len(TOKENS) == 16 and task.num_classes == 10


def test_med_of_an_even_count_is_the_floored_mean_of_the_middle_pair():
    from sparse_attn.data.tasks.listops import apply_op

    assert apply_op(2, [1, 4]) == int(np.median([1, 4])) == 2
    assert apply_op(2, [9, 0, 3, 8]) == 5
    assert apply_op(3, [9, 9, 3]) == 1


def test_random_access_is_deterministic_and_split_dependent():
    a = ListOps(seq_len=128).source("train")
    b = ListOps(seq_len=128).source("train")
    order = [7, 3, 11, 0, 5]
    shuffled = {i: a[i] for i in order}
    for i in sorted(order):
        for k, v in b[i].items():
            np.testing.assert_array_equal(v, shuffled[i][k])
    np.testing.assert_array_equal(a[-1]["inputs"], a[len(a) - 1]["inputs"])
    valid = ListOps(seq_len=128).source("validation")
    other_seed = ListOps(seq_len=128, seed=1).source("train")
    assert not np.array_equal(valid[0]["inputs"], a[0]["inputs"])
    assert not np.array_equal(other_seed[0]["inputs"], a[0]["inputs"])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="min_length"):
        ListOps(seq_len=128, max_length=200)
    with pytest.raises(IndexError):
        ListOps(seq_len=128, num_train=3).source("train")[3]
    with pytest.raises(ValueError, match="split"):
        ListOps(seq_len=128).source("dev")
