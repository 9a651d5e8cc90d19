"""Independent oracles for the TL tests: explicit stacked-layer graphs, not the library's partner-array kernels."""

from __future__ import annotations

from collections import deque

import numpy as np


def stacked_word_diagram(word, n: int) -> tuple[np.ndarray, int]:
    """D(w) by drawing the whole stack of T layers as a graph and following its strands.

    Node (t, x) is position x on the horizontal line below layer t (t = 0: the top row). Layer t joins (t, x) to
    (t+1, x) for straight strands, and e_i adds the cap (t, i)-(t, i+1) and the cup (t+1, i)-(t+1, i+1).
    """
    T = len(word)
    adj: dict[tuple[int, int], list[tuple[int, int]]] = {(t, x): [] for t in range(T + 1) for x in range(n)}

    def link(u, v):
        adj[u].append(v)
        adj[v].append(u)

    for t, i in enumerate(word):
        for x in range(n):
            if x not in (i, i + 1):
                link((t, x), (t + 1, x))
        link((t, i), (t, i + 1))
        link((t + 1, i), (t + 1, i + 1))

    def boundary_index(u):
        t, x = u
        if t == 0:
            return x
        if t == T:
            return n + x
        return None

    p = np.full(2 * n, -1, np.int64)
    seen: set[tuple[int, int]] = set()
    loops = 0
    for start in adj:
        if start in seen:
            continue
        comp, todo = [], deque([start])
        seen.add(start)
        while todo:
            u = todo.popleft()
            comp.append(u)
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        ends = [boundary_index(u) for u in comp if boundary_index(u) is not None]
        if T == 0:  # top row = bottom row: each node is both ends of its strand
            ends = [comp[0][1], n + comp[0][1]]
        if not ends:
            loops += 1
        else:
            assert len(ends) == 2, (word, comp)
            p[ends[0]], p[ends[1]] = ends[1], ends[0]
    return p, loops


def bfs_shortlex(n: int) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Shortlex-minimal word of every reachable diagram, by BFS from the identity with e_0 < e_1 < ...

    Uses the stacked-graph oracle (slow but independent), so keep n small.
    """
    first: dict[tuple[int, ...], tuple[int, ...]] = {}
    start = tuple(stacked_word_diagram([], n)[0])
    first[start] = ()
    frontier = [()]
    while frontier:
        nxt = []
        for w in frontier:
            for i in range(n - 1):
                u = w + (i,)
                d = tuple(stacked_word_diagram(u, n)[0])
                if d not in first:
                    first[d] = u
                    nxt.append(u)
        frontier = nxt
    return first


def independent_layers(rng: np.random.Generator, n: int, depth: int) -> np.ndarray:
    """Random bool[depth, n-1] layers with no two adjacent generators in a layer."""
    sel = rng.random((depth, n - 1)) < 0.5
    for t in range(depth):
        for i in range(1, n - 1):
            if sel[t, i] and sel[t, i - 1]:
                sel[t, i] = False
    return sel


def pair_closing_generators(p: np.ndarray, a: int, b: int) -> list[int]:
    """Generators whose product, applied on the bottom of diagram p (partner array over 2n points), caps its
    consecutive defects a < b: the bottom end of a's strand, then every arc top hopped over up to b's bottom end."""
    n = p.shape[0] // 2
    x, end = int(p[a]) - n, int(p[b]) - n
    gens, y = [x], x + 1
    while y < end:
        r = int(p[n + y]) - n
        gens.append(r)
        y = r + 1
    return gens
