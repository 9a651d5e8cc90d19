"""Independent numpy definitions of ABCA (docs/abca.md), written from the text with plain loops."""

import numpy as np


def cap_anchors(mask_N, valid_len, max_zone):
    """Greedy zone cap on one sequence: position 0 forced; a fallback wherever max_zone passes without an anchor."""
    out = np.zeros(len(mask_N), bool)
    last = None
    for t in range(valid_len):
        if t == 0 or mask_N[t] or t - last == max_zone:
            out[t] = True
            last = t
    inserted = int(np.sum(out & ~np.asarray(mask_N, bool)))
    return out, inserted


def anchor_list(is_anchor_N, valid_len):
    return [t for t in range(valid_len) if is_anchor_N[t]]


def left_right(t, anchors, valid_len):
    left = max(a for a in anchors if a <= t)
    later = [a for a in anchors if a > t]
    return left, (later[0] if later else valid_len - 1)


def layer_mask(is_anchor_N, valid_len, causal):
    """bool[N, N]: stage 1 rows at anchors, stage 3 rows at interval tokens."""
    n = len(is_anchor_N)
    anchors = anchor_list(is_anchor_N, valid_len)
    mask = np.zeros((n, n), bool)
    for t in range(valid_len):
        if t in anchors:
            j = anchors.index(t)
            lo = anchors[j - 1] if j > 0 else t
            hi = t if causal else left_right(t, anchors, valid_len)[1]
        else:
            lo, hi = left_right(t, anchors, valid_len)
            hi = t if causal else hi
        mask[t, lo : hi + 1] = True
    return mask


def handshake_mask(is_anchor_N, valid_len, causal, kind="chain", max_anchors=None):
    n = len(is_anchor_N)
    anchors = anchor_list(is_anchor_N, valid_len)
    mask = np.zeros((n, n), bool)
    for j, a in enumerate(anchors):
        if kind == "global" and j < max_anchors:
            keys = anchors[: min(len(anchors), max_anchors)]
            keys = [b for i, b in enumerate(keys) if not causal or i <= j]
        else:
            keys = [anchors[j - 1]] if j > 0 else []
            keys.append(a)
            if not causal and j + 1 < len(anchors):
                keys.append(anchors[j + 1])
        mask[a, keys] = True
    return mask


def _attend(q_D, k_KxD, v_KxD, scale):
    s = k_KxD @ q_D * scale
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v_KxD


def _rope(x_D, pos, base):
    if base is None:
        return x_D
    half = len(x_D) // 2
    freq = base ** (-np.arange(half) / half)
    ang = pos * freq
    x1, x2 = x_D[:half], x_D[half:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)])


def anchor_states(
    q, k, v, is_anchor, valid_len, wq, wk, wv, *, causal, steps, kind="chain", max_anchors=None, rope_base=None, scale
):
    """Stages 1 and 2 for one sequence and one head: {anchor: state [D]}."""
    anchors = anchor_list(is_anchor, valid_len)
    m1 = layer_mask(is_anchor, valid_len, causal)
    s = {a: _attend(q[a], k[m1[a]], v[m1[a]], scale) for a in anchors}
    hs = handshake_mask(is_anchor, valid_len, causal, kind, max_anchors)
    for _ in range(steps):
        proj = {a: (_rope(s[a] @ wq, a, rope_base), _rope(s[a] @ wk, a, rope_base), s[a] @ wv) for a in anchors}
        s = {
            a: s[a]
            + _attend(
                proj[a][0],
                np.stack([proj[b][1] for b in np.flatnonzero(hs[a])]),
                np.stack([proj[b][2] for b in np.flatnonzero(hs[a])]),
                scale,
            )
            for a in anchors
        }
    return s


def abca_forward_gqa(q, k, v, is_anchor, valid_len, wq, wk, wv, *, rope_base=None, scale=None, **kw):
    """The three stages for one sequence: q [N, H, D], k, v [N, G, D] (query head h reads KV group h // (H / G); G = H
    is plain multi-head attention); w* [H, D, D]. An anchor's zone key/value for group g is the sum of its g heads'
    re-projected states."""
    n, h, d = q.shape
    g = k.shape[1]

    def group(head):
        return head // (h // g)

    scale = 1 / np.sqrt(d) if scale is None else scale
    anchors = anchor_list(is_anchor, valid_len)
    states = [
        anchor_states(q[:, i], k[:, group(i)], v[:, group(i)], is_anchor, valid_len, wq[i], wk[i], wv[i],
                      rope_base=rope_base, scale=scale, **kw)
        for i in range(h)
    ]  # fmt: skip
    k3, v3 = k.copy(), v.copy()
    for a in anchors:
        for j in range(g):
            heads = [i for i in range(h) if group(i) == j]
            k3[a, j] = sum(_rope(states[i][a] @ wk[i], a, rope_base) for i in heads)
            v3[a, j] = sum(states[i][a] @ wv[i] for i in heads)
    m1 = layer_mask(is_anchor, valid_len, kw["causal"])
    out = np.zeros((n, h, d))
    for t in range(valid_len):
        for i in range(h):
            j = group(i)
            out[t, i] = states[i][t] if t in anchors else _attend(q[t, i], k3[m1[t], j], v3[m1[t], j], scale)
    return out


def abca_forward_summaries(q, k, v, is_anchor, valid_len, wq, wk, wv, wsum, *, rope_base=None, scale=None, **kw):
    """`abca_forward_gqa` with P = 1 + len(wsum) summaries per anchor (pooled writes): summary p >= 1 runs stages 1
    and 2 with the gather query q @ wsum[p - 1][head]; a zone row reads, besides its keys, every extra summary of
    each anchor its row holds (one more key/value each, re-projected as summary 0's)."""
    n, h, d = q.shape
    g = k.shape[1]

    def group(head):
        return head // (h // g)

    scale = 1 / np.sqrt(d) if scale is None else scale
    anchors = anchor_list(is_anchor, valid_len)
    summaries = [np.eye(d)[None].repeat(h, 0), *wsum]  # summary 0 gathers with q itself
    states = [
        [
            anchor_states(q[:, i] @ w[i], k[:, group(i)], v[:, group(i)], is_anchor, valid_len, wq[i], wk[i], wv[i],
                          rope_base=rope_base, scale=scale, **kw)
            for i in range(h)
        ]
        for w in summaries
    ]  # fmt: skip
    kx = np.zeros((len(summaries), n, g, d))
    vx = np.zeros((len(summaries), n, g, d))
    for p, st in enumerate(states):
        for a in anchors:
            for j in range(g):
                heads = [i for i in range(h) if group(i) == j]
                kx[p, a, j] = sum(_rope(st[i][a] @ wk[i], a, rope_base) for i in heads)
                vx[p, a, j] = sum(st[i][a] @ wv[i] for i in heads)
    m1 = layer_mask(is_anchor, valid_len, kw["causal"])
    out = np.zeros((n, h, d))
    for t in range(valid_len):
        for i in range(h):
            if t in anchors:
                out[t, i] = states[0][i][t]
                continue
            j, row = group(i), np.flatnonzero(m1[t])
            keys = [kx[0, c, j] if c in anchors else k[c, j] for c in row]
            vals = [vx[0, c, j] if c in anchors else v[c, j] for c in row]
            for c in (c for c in row if c in anchors):
                keys += [kx[p, c, j] for p in range(1, len(summaries))]
                vals += [vx[p, c, j] for p in range(1, len(summaries))]
            out[t, i] = _attend(q[t, i], np.stack(keys), np.stack(vals), scale)
    return out
