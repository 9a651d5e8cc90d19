"""Pathfinder-style images (Linsley et al. 2018; LRA's long-range image task), generated offline.

A `size` x `size` binary image holds two *main* paths of `path_length` steps and `num_distractors` shorter
paths of `distractor_length` steps. A path is a smooth random walk: unit steps whose heading turns by
N(0, curvature^2) radians per step, rasterised by rounding (consecutive pixels are 8-neighbours), bending
away from obstacles (see `_walk`). Paths keep one background pixel between each other (no two are
8-adjacent) and stay off the border. Two 3x3 *dots* mark path ends: label 1 puts them on the two ends of
main path A; label 0 on one end of A and one of B (random ends); dots never touch each other or another
path. Both classes hold the same paths, so pixel counts and path statistics do not tell the label; the
dot-to-dot distance could (ends of one path vs. ends of two), so it is returned as `dot_distance` (rounded
Euclidean, pixels) and its shortcut accuracy is measured in docs/tasks.md (~53%).

Label = connectivity: the two dots lie in one 8-connected component of non-background pixels. Every image is
checked by a flood fill (the paths form exactly 2 + num_distractors components) and redrawn otherwise.

Tokens, row-major: 0 pad (unused: every image fills seq_len = size**2), 1 background, 2 path, 3 dot.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sparse_attn.data.tasks.common import GeneratedSource

BACKGROUND, PATH, DOT = 1, 2, 3
MAX_IMAGE_ATTEMPTS = 1000
MAX_PATH_ATTEMPTS = 20
STEER = (0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0)  # heading offsets tried at an obstacle


def _walk(rng: np.random.Generator, steps: int, size: int, curvature: float, blocked: np.ndarray):
    """Pixels [(r, c)] of one path avoiding `blocked`, itself and a 1-pixel border, or None if stuck.

    At an obstacle the heading bends by the first workable offset in STEER (mirrored per path at random).
    """
    r0, c0 = (int(v) for v in rng.integers(1, size - 1, size=2))
    if blocked[r0, c0]:
        return None
    theta = float(rng.uniform(0, 2 * math.pi))
    mirror = 1.0 if rng.integers(2) else -1.0
    turns = rng.normal(0.0, curvature, size=steps).tolist()
    y, x = float(r0), float(c0)
    pixels = [(r0, c0)]
    seen = {(r0, c0)}
    for turn in turns:
        for offset in STEER:
            heading = theta + turn + mirror * offset
            ny, nx = y + math.sin(heading), x + math.cos(heading)
            r, c = math.floor(ny + 0.5), math.floor(nx + 0.5)
            if (r, c) == pixels[-1]:
                break
            if 1 <= r < size - 1 and 1 <= c < size - 1 and not blocked[r, c] and (r, c) not in seen:
                pixels.append((r, c))
                seen.add((r, c))
                break
        else:
            return None
        theta, y, x = heading, ny, nx
    return pixels


def _block_around(blocked: np.ndarray, pixels) -> None:
    for r, c in pixels:  # paths stay off the border, so r - 1 >= 0
        blocked[r - 1:r + 2, c - 1:c + 2] = True


def components(image: np.ndarray) -> tuple[int, dict[tuple[int, int], int]]:
    """8-connected components of non-background pixels: (count, {(r, c): component id})."""
    rows, cols = np.nonzero(image != BACKGROUND)
    todo = set(zip(rows.tolist(), cols.tolist(), strict=True))
    comp: dict[tuple[int, int], int] = {}
    n = 0
    while todo:
        start = todo.pop()
        comp[start] = n
        stack = [start]
        while stack:
            r, c = stack.pop()
            for q in ((r - 1, c - 1), (r - 1, c), (r - 1, c + 1), (r, c - 1), (r, c + 1),
                      (r + 1, c - 1), (r + 1, c), (r + 1, c + 1)):
                if q in todo:
                    todo.remove(q)
                    comp[q] = n
                    stack.append(q)
        n += 1
    return n, comp


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pathfinder:
    """Pathfinder at `size` x `size` (32 or 64 in the studies), 2 classes, `seq_len = size**2` pixel tokens.

    Defaults scale with size: main paths of `size` steps, distractors of `size // 2` steps,
    `size // 16` distractors. Fields: `inputs`, `label`, `valid_len`, `dot_distance`.
    """

    size: int = 32
    path_length: int | None = None
    num_distractors: int | None = None
    distractor_length: int | None = None
    curvature: float = 0.25
    seed: int = 0
    num_train: int = 96_000
    num_validation: int = 2_000
    num_test: int = 2_000

    num_classes = 2
    vocab_size = 4
    levels = 3  # intensity levels for `common.patchify`

    def __post_init__(self):
        if self.size < 8:
            raise ValueError(f"size must be >= 8, got {self.size}")
        if self.lengths[0] < 2 or self.lengths[2] < 1:
            raise ValueError(f"path lengths must be >= 2 steps, got {self.lengths}")

    @property
    def seq_len(self) -> int:
        return self.size * self.size

    @property
    def lengths(self) -> tuple[int, int, int]:
        """(main path steps, number of distractors, distractor steps)."""
        main = self.size if self.path_length is None else self.path_length
        num = self.size // 16 if self.num_distractors is None else self.num_distractors
        dist = self.size // 2 if self.distractor_length is None else self.distractor_length
        return main, num, dist

    def _draw(self, rng: np.random.Generator, label: int):
        main, num, dist = self.lengths
        blocked = np.zeros((self.size, self.size), dtype=bool)
        paths = []
        for steps in [main, main] + [dist] * num:
            for _ in range(MAX_PATH_ATTEMPTS):
                pixels = _walk(rng, steps, self.size, self.curvature, blocked)
                if pixels is not None and len(pixels) >= 2:
                    break
            else:
                return None
            _block_around(blocked, pixels)
            paths.append(pixels)
        a, b = paths[0], paths[1]
        ends = (a[0], a[-1]) if label else ((a[0], a[-1])[rng.integers(2)], (b[0], b[-1])[rng.integers(2)])
        (r1, c1), (r2, c2) = ends
        if max(abs(r1 - r2), abs(c1 - c2)) < 4:
            return None  # the dots would touch: keep a background pixel between them
        image = np.full((self.size, self.size), BACKGROUND, dtype=np.int32)
        for pixels in paths:
            rows, cols = zip(*pixels, strict=True)
            image[rows, cols] = PATH
        for r, c in ends:
            image[r - 1:r + 2, c - 1:c + 2] = DOT
        n, comp = components(image)
        if n != len(paths) or (comp[ends[0]] == comp[ends[1]]) != bool(label):
            return None  # a dot touched another path, or two paths merged: redraw
        return image, ends

    def example(self, rng: np.random.Generator) -> dict:
        label = int(rng.integers(2))
        for _ in range(MAX_IMAGE_ATTEMPTS):
            drawn = self._draw(rng, label)
            if drawn is not None:
                break
        else:
            raise RuntimeError(f"could not place the paths of {self} in {MAX_IMAGE_ATTEMPTS} attempts")
        image, (p, q) = drawn
        return {"inputs": image.reshape(-1), "label": label, "valid_len": self.seq_len,
                "dot_distance": round(math.dist(p, q))}

    def source(self, split: str) -> GeneratedSource:
        n = {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}.get(split, 0)
        return GeneratedSource(self, split, self.example, n)
