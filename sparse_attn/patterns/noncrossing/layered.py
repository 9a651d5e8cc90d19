"""Host constructions of nested structure: layered words from target caps, TL_{2n} doubling
(docs/noncrossing.md, "Diagram algebra").

Oracles for the jax routers and helpers for docs and tests; not on the model's hot path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparse_attn.patterns.noncrossing import diagram_np


def check_link_state(caps: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Validates target caps on n tokens: disjoint, non-crossing, no unmatched point inside a cap."""
    out = sorted((min(a, b), max(a, b)) for a, b in caps)
    used = np.zeros(n, bool)
    for a, b in out:
        if not (0 <= a < b < n):
            raise ValueError(f"cap {(a, b)} is not inside 0..{n - 1}")
        if used[a] or used[b]:
            raise ValueError(f"cap {(a, b)} reuses a point")
        used[a] = used[b] = True
    stack, partner = [], {a: b for a, b in out} | {b: a for a, b in out}
    for x in range(n):
        if x not in partner:
            if stack:
                raise ValueError(
                    f"point {x} is unmatched inside cap {(stack[-1], partner[stack[-1]])}: not a TL link state"
                )
            continue
        if partner[x] > x:
            stack.append(x)
        elif not stack or stack.pop() != partner[x]:
            raise ValueError(f"cap {(partner[x], x)} crosses another cap")
    return out


def cap_heights(caps: Sequence[tuple[int, int]], n: int) -> dict[tuple[int, int], int]:
    """height(c) = 1 + max height of the caps directly inside c (innermost caps have height 1)."""
    caps = check_link_state(caps, n)
    height: dict[tuple[int, int], int] = {}
    for a, b in sorted(caps, key=lambda c: c[1] - c[0]):  # inner caps are shorter
        inside = [height[c] for c in height if a < c[0] and c[1] < b]
        height[(a, b)] = 1 + max(inside, default=0)
    return height


def nesting_depth(caps: Sequence[tuple[int, int]], n: int) -> int:
    return max(cap_heights(caps, n).values(), default=0)


def layered_word(caps: Sequence[tuple[int, int]], n: int) -> list[list[int]]:
    """Layers of commuting generators whose product has exactly these top caps, defects straight, no loops.

    Layer t closes the caps of height t: ``e_a`` plus the right ends of the outermost bottom cups inside (a, b).
    """
    height = cap_heights(caps, n)
    p = diagram_np.identity(n)
    layers = []
    for t in range(1, max(height.values(), default=0) + 1):
        layer = []
        for (a, b), h in sorted(height.items()):
            if h != t:
                continue
            layer.append(a)
            x = a + 1
            while x < b:
                r = int(p[n + x]) - n  # right end of the outermost cup starting at bottom x
                layer.append(r)
                x = r + 1
        for i in sorted(layer):
            diagram_np.rmul_gen(p, i)
        layers.append(sorted(layer))
    return layers


def doubled_caps(pairs: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Embeds a non-crossing partial matching of n tokens (Motzkin) as TL_{2n} caps on half-points 2t, 2t+1.

    A pair (a, b) becomes caps (2a, 2b+1) and (2a+1, 2b); an unmatched token c becomes the self-cap (2c, 2c+1).
    """
    matched = {}
    for a, b in pairs:
        a, b = min(a, b), max(a, b)
        if a == b or not (0 <= a and b < n) or a in matched or b in matched:
            raise ValueError(f"pair {(a, b)} is not a pair of distinct unused tokens in 0..{n - 1}")
        matched[a], matched[b] = b, a
    caps = []
    for t in range(n):
        if t not in matched:
            caps.append((2 * t, 2 * t + 1))
        elif matched[t] > t:
            caps += [(2 * t, 2 * matched[t] + 1), (2 * t + 1, 2 * matched[t])]
    return check_link_state(caps, 2 * n)  # raises if the token pairs cross


def token_edges_doubled(p_4N: np.ndarray) -> set[tuple[int, int]]:
    """Token-level edges of a TL_{2n} diagram: top caps joining half-points of different tokens."""
    return {(x // 2, y // 2) for x, y in diagram_np.caps(p_4N) if x // 2 != y // 2}
