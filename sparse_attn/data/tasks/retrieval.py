"""Long-range retrieval for causal LMs: multi-query associative recall and passkey retrieval (docs/tasks.md).

Both follow the random-access protocol of `common` (example `i` of a split is a pure function of
`(seed, split, i)`), but an example is a next-token problem instead of a labelled sequence:

    source[i] == {"inputs": int32[seq_len], "targets": int32[seq_len], "loss_mask": int32[seq_len],
                  "valid_len": int32, "answer_pos": int32[Q], "answer": int32[Q], "distance": int32[Q], ...}

`targets` is `inputs` shifted by one (the example is `seq_len + 1` tokens long); `loss_mask` is 1 exactly at
the `Q` answer positions (`inputs[answer_pos]` is the last token before the answer, `targets[answer_pos]` the
answer). `distance[j]` is how far back the answer's evidence lies: `answer_pos[j]` minus the position (in
`inputs`) of the token the model must find, so accuracy can be broken down by distance.

* `AssociativeRecall` (multi-query associative recall): `num_pairs` key-value pairs (distinct keys, 2 adjacent
  tokens each) at uniformly random non-overlapping places among random filler tokens, then a query marker and
  `num_queries` of those keys, each followed by its value (teacher forcing: query j + 1 is asked after answer j).
  Evidence: the key's position in the context.
* `Passkey`: a 5-digit passkey sentence hidden at `depth` (fraction of the context) in repeated filler text,
  asked at the end ("What is the pass key? The pass key is 12345"); bytes, so a byte-level LM reads it as text.
  The answer is the `num_digits` digits; evidence of digit j: digit j of the hidden sentence's first mention.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparse_attn.data.tasks.common import GeneratedSource, split_id

QUERY_ID = 1  # associative recall: marks the start of the queries
FILLER_TEXT = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = b"The pass key is %s. Remember it. %s is the pass key. "
QUESTION = b"What is the pass key? The pass key is %s"


def _sizes(task) -> dict[str, int]:
    return {"train": task.num_train, "validation": task.num_validation, "test": task.num_test}


def _check_len(task, min_len: int) -> None:
    if task.seq_len < min_len:
        raise ValueError(f"{type(task).__name__}: seq_len={task.seq_len} leaves no room; it needs >= {min_len}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AssociativeRecall:
    """Multi-query associative recall. Tokens: 0 pad (unused), 1 query marker, then `num_filler` filler tokens,
    `num_keys` keys and `num_values` values (vocab_size = 2 + num_filler + num_keys + num_values)."""

    seq_len: int = 1024
    num_pairs: int = 32
    num_queries: int = 16
    num_keys: int = 64
    num_values: int = 64
    num_filler: int = 16
    seed: int = 0
    num_train: int = 100_000
    num_validation: int = 1_000
    num_test: int = 1_000

    def __post_init__(self):
        if not 1 <= self.num_queries <= self.num_pairs <= self.num_keys:
            raise ValueError(f"need 1 <= num_queries ({self.num_queries}) <= num_pairs ({self.num_pairs}) "
                             f"<= num_keys ({self.num_keys}): keys are distinct within an example")
        if self.num_values < 2 or self.num_filler < 1:
            raise ValueError(f"need num_values >= 2 and num_filler >= 1, got {self.num_values}, {self.num_filler}")
        # The context (seq_len - 2Q tokens) must hold the pairs.
        _check_len(self, 2 * self.num_queries + 2 * self.num_pairs)

    @property
    def vocab_size(self) -> int:
        return 2 + self.num_filler + self.num_keys + self.num_values

    @property
    def num_classes(self) -> int:
        return self.num_values

    @property
    def key_offset(self) -> int:
        return 2 + self.num_filler

    @property
    def value_offset(self) -> int:
        return self.key_offset + self.num_keys

    def source(self, split: str) -> GeneratedSource:
        split_id(split)
        return GeneratedSource(self, split, self._example, _sizes(self)[split])

    def _example(self, rng: np.random.Generator) -> dict:
        p, q = self.num_pairs, self.num_queries
        context = self.seq_len - 2 * q  # tokens[0:context], then the marker and q (key, value) pairs
        tokens = np.empty(self.seq_len + 1, np.int64)
        tokens[:context] = 2 + rng.integers(0, self.num_filler, size=context)
        # Uniform over non-overlapping placements: p distinct sorted draws from [0, context - p), shifted by rank.
        key_pos = np.sort(rng.choice(context - p, size=p, replace=False)) + np.arange(p)
        keys = self.key_offset + rng.choice(self.num_keys, size=p, replace=False)
        values = self.value_offset + rng.integers(0, self.num_values, size=p)
        tokens[key_pos], tokens[key_pos + 1] = keys, values
        tokens[context] = QUERY_ID
        asked = rng.choice(p, size=q, replace=False)
        answer_pos = context + 1 + 2 * np.arange(q)  # inputs[answer_pos] = key, targets[answer_pos] = value
        tokens[answer_pos], tokens[answer_pos + 1] = keys[asked], values[asked]
        loss_mask = np.zeros(self.seq_len, np.int64)
        loss_mask[answer_pos] = 1
        return {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss_mask, "valid_len": self.seq_len,
                "answer_pos": answer_pos, "answer": values[asked], "distance": answer_pos - key_pos[asked]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Passkey:
    """Passkey retrieval in bytes (vocab 256). `depths`: the hidden sentence's depths to draw from (fractions of
    the context, 0 = start, 1 = just before the question); None draws it uniformly in [0, 1]."""

    seq_len: int = 1024
    num_digits: int = 5
    depths: tuple[float, ...] | None = None
    seed: int = 0
    num_train: int = 100_000
    num_validation: int = 1_000
    num_test: int = 1_000

    def __post_init__(self):
        if not 1 <= self.num_digits <= 18:
            raise ValueError(f"num_digits must be in [1, 18], got {self.num_digits}")
        if self.depths is not None and (not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths)):
            raise ValueError(f"depths must be a non-empty tuple of fractions in [0, 1], got {self.depths}")
        digits = b"0" * self.num_digits
        _check_len(self, len(NEEDLE % (digits, digits)) + len(QUESTION % digits))

    vocab_size = 256
    num_classes = 10

    def source(self, split: str) -> GeneratedSource:
        split_id(split)
        return GeneratedSource(self, split, self._example, _sizes(self)[split])

    def _example(self, rng: np.random.Generator) -> dict:
        key = "".join(str(d) for d in rng.integers(0, 10, size=self.num_digits)).encode()
        needle, question = NEEDLE % (key, key), QUESTION % key
        context = self.seq_len + 1 - len(question)
        room = context - len(needle)  # filler bytes around the needle
        depth = rng.uniform() if self.depths is None else self.depths[rng.integers(len(self.depths))]
        # The needle goes at a sentence start of the filler at or before depth * room (room itself if none).
        starts = _sentence_starts(room)
        at = int(starts[np.searchsorted(starts, int(depth * room), side="right") - 1])
        filler = np.frombuffer(FILLER_TEXT * (room // len(FILLER_TEXT) + 1), np.uint8)[:room]
        tokens = np.concatenate([filler[:at], np.frombuffer(needle, np.uint8), filler[at:],
                                 np.frombuffer(question, np.uint8)]).astype(np.int64)
        answer_pos = np.arange(self.seq_len - self.num_digits, self.seq_len)
        loss_mask = np.zeros(self.seq_len, np.int64)
        loss_mask[answer_pos] = 1
        evidence = at + len(b"The pass key is ") + np.arange(self.num_digits)  # each digit in the needle
        return {"inputs": tokens[:-1], "targets": tokens[1:], "loss_mask": loss_mask, "valid_len": self.seq_len,
                "answer_pos": answer_pos, "answer": tokens[answer_pos + 1], "distance": answer_pos - evidence,
                "depth_permille": round(1000 * at / max(room, 1))}


def _sentence_starts(room: int) -> np.ndarray:
    """int64[S]: offsets in the repeated filler (of `room` bytes) where a sentence starts, with 0 and `room`."""
    one = np.flatnonzero(np.frombuffer(FILLER_TEXT, np.uint8) == ord(".")) + 2  # ". " then the next sentence
    reps = room // len(FILLER_TEXT) + 1
    starts = (np.arange(reps)[:, None] * len(FILLER_TEXT) + np.concatenate([[0], one[one < len(FILLER_TEXT)]])).ravel()
    return np.unique(np.concatenate([starts[starts <= room], [room]]))
