"""Position labels (patterns.labels.position): near pairs always share one, and only near pairs inside the window."""

import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns.labels import position


@pytest.mark.parametrize("radius,cell", [(32, 8), (7, 2), (5, 12), (64, 10), (3, 4)])
def test_near_pairs_share_and_far_window_pairs_do_not(radius, cell):
    n = 3 * radius + 2 * cell + 5
    lab = np.asarray(position.position_labels(jnp.arange(n), cell, radius, offset=0))  # [N, 2]
    share = (lab[:, None, :] == lab[None, :, :]).any(-1)
    d = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    assert share[d < cell // 2].all()  # the guarantee
    in_window = d <= radius
    assert not share[in_window & (d >= cell)].any()  # inside the window, only within a cell
    # Not everything within a cell is forced: the pattern is not simply a radius.
    if 4 <= cell <= radius:
        assert not share[in_window & (d >= cell // 2)].all()
    assert lab.max() < position.num_position_labels(cell, radius)


def test_appended_labels_stay_ascending_and_memberships_one_hot():
    rng = np.random.default_rng(0)
    b, n, num_labels, k = 2, 40, 6, 2
    top = np.sort(np.stack([rng.choice(num_labels, k, replace=False) for _ in range(b * n)]), -1).reshape(b, 1, n, k)
    p = rng.random((b, 1, n, num_labels)).astype(np.float32)
    labels, p_all, total = position.with_position_labels(jnp.asarray(top, jnp.int32), jnp.asarray(p), 8, 12)
    m2 = position.num_position_labels(8, 12)
    assert total == num_labels + m2 and labels.shape == (b, 1, n, k + 2) and p_all.shape == (b, 1, n, total)
    assert (np.diff(np.asarray(labels), axis=-1) > 0).all()
    np.testing.assert_array_equal(np.asarray(p_all[..., :num_labels]), p)
    extra = np.asarray(p_all[..., num_labels:])
    assert set(np.unique(extra)) <= {0.0, 1.0} and (extra.sum(-1) == 2).all()
    # The memberships mark exactly the appended labels.
    idx = np.asarray(labels[..., k:]) - num_labels
    assert (np.take_along_axis(extra, idx, -1) == 1).all()


@pytest.mark.parametrize("cell", [-2, 3, 7, True, 2.0])
def test_bad_cells_are_refused(cell):
    with pytest.raises(ValueError, match="position_cell"):
        position.check_cell(cell, 32, 8, 64)


def test_too_many_labels_are_refused_with_the_count():
    with pytest.raises(ValueError, match="exceeds 64"):
        position.check_cell(2, 64, 32, 64)
    position.check_cell(0, 64, 64, 64)  # off: nothing added
