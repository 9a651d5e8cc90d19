"""String rewriting on TL words: the seed's rules, the mirror rule, and the complete system A–D
(docs/noncrossing.md, "Diagram algebra").

A rewriting system is a dict ``lhs -> rhs`` of tuples of generator indices for a fixed n. Rewriting is a test
oracle only; the hot path composes diagrams and reads the normal form off them (normal_form.py).
"""

from __future__ import annotations

from collections.abc import Iterator

Rules = dict[tuple[int, ...], tuple[int, ...]]


def idempotence_rules(n: int) -> Rules:
    """(R1) = (A): ``e_i e_i -> e_i``."""
    return {(i, i): (i,) for i in range(n - 1)}


def commutation_rules(n: int) -> Rules:
    """(R-comm) = (B): ``e_j e_i -> e_i e_j`` for j >= i+2 (one direction only, so it terminates)."""
    return {(j, i): (i, j) for j in range(n - 1) for i in range(j - 1)}


def seed_braid_rules(n: int) -> Rules:
    """(R3): ``e_{i+1} e_i e_{i+1} -> e_{i+1}``."""
    return {(i + 1, i, i + 1): (i + 1,) for i in range(n - 2)}


def mirror_rules(n: int) -> Rules:
    """(R2): ``e_i e_{i+1} e_i -> e_i``; without it the seed's system presents a larger monoid."""
    return {(i, i + 1, i): (i,) for i in range(n - 2)}


def seed_rules(n: int) -> Rules:
    return {**idempotence_rules(n), **commutation_rules(n), **seed_braid_rules(n)}


def seed_and_mirror_rules(n: int) -> Rules:
    return {**seed_rules(n), **mirror_rules(n)}


def complete_rules(n: int) -> Rules:
    """The complete (terminating, confluent) system A–D whose irreducible words are the Jones normal forms."""
    rules = {**idempotence_rules(n), **commutation_rules(n)}
    m = n - 1
    for k in range(m):
        for j in range(k + 1, m):
            down = tuple(range(j, k - 1, -1))  # e_j e_{j-1} ... e_k
            rules[(k,) + down] = (k,) + tuple(range(j, k + 1, -1))  # (C)
    for j in range(m):
        for i in range(j):
            down = tuple(range(j, i - 1, -1))  # e_j ... e_i
            rules[down + (j,)] = tuple(range(j - 2, i - 1, -1)) + (j,)  # (D)
    return rules


def _lengths(rules: Rules) -> list[int]:
    return sorted({len(lhs) for lhs in rules})


def successors(word, rules: Rules) -> Iterator[tuple[int, ...]]:
    """Every word one rewrite step away (each position, each matching rule)."""
    w = tuple(int(i) for i in word)
    lengths = _lengths(rules)
    for s in range(len(w)):
        for ell in lengths:
            rhs = rules.get(w[s : s + ell])
            if rhs is not None and s + ell <= len(w):
                yield w[:s] + rhs + w[s + ell :]


def rewrite_once(word, rules: Rules) -> tuple[int, ...] | None:
    """The leftmost (then shortest) single rewrite, or None if the word is irreducible."""
    return next(successors(word, rules), None)


def reduce(word, rules: Rules, max_steps: int = 100_000) -> tuple[int, ...]:
    """Rewrites leftmost-first to a fixpoint (an irreducible word)."""
    w = tuple(int(i) for i in word)
    for _ in range(max_steps):
        nxt = rewrite_once(w, rules)
        if nxt is None:
            return w
        w = nxt
    raise RuntimeError(f"no fixpoint after {max_steps} steps: the system does not terminate from {word}")


def irreducible_descendants(word, rules: Rules) -> set[tuple[int, ...]]:
    """All irreducible words reachable by any rewrite order (exhaustive search; small words only)."""
    start = tuple(int(i) for i in word)
    todo, seen, out = [start], {start}, set()
    while todo:
        w = todo.pop()
        nxt = list(successors(w, rules))
        if not nxt:
            out.add(w)
        for u in nxt:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return out


def seed_one_pass(word, n: int) -> tuple[int, ...]:
    """The seed's literal procedure: one scan of R1, then sorting far commutations, then one scan of R3.

    Sound (every step keeps the diagram) but neither a fixpoint nor canonical.
    """
    w = list(int(i) for i in word)
    out = []
    for i in w:  # e_i e_i -> e_i, left to right
        if not out or out[-1] != i:
            out.append(i)
    changed = True
    while changed:  # bubble e_j e_i (j >= i+2) into increasing order
        changed = False
        for s in range(len(out) - 1):
            if out[s] >= out[s + 1] + 2:
                out[s], out[s + 1] = out[s + 1], out[s]
                changed = True
    res, s = [], 0
    while s < len(out):  # one left-to-right scan of e_{i+1} e_i e_{i+1} -> e_{i+1}
        if s + 2 < len(out) and out[s] == out[s + 2] == out[s + 1] + 1:
            res.append(out[s])
            s += 3
        else:
            res.append(out[s])
            s += 1
    return tuple(res)
