"""Training batches built ahead in a worker thread while the device runs the step.

Generated tasks cost ~1-2 ms per example in Python (docs/tasks.md: ListOps 2048 ~540 examples per CPU-second),
about as long as a GPU step of the non-crossing research document's encoder (6 x 256). Batch `t` of `TaskBatches`
is a pure function of `(seed, t)`, so a worker can build batches `t+1 .. t+depth` while step `t` runs (XLA releases
the GIL), and the state stays `{"seed", "step"}` of the batches *handed out*: a checkpoint never counts a
prefetched batch, and a resume rebuilds it. Same batches, same order as `TaskBatches`.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor

from sparse_attn.data.tasks import TaskBatches


class PrefetchBatches:
    """`TaskBatches(source, ...)` with the next `depth` batches built in one worker thread."""

    def __init__(self, source, *, global_batch: int, seed: int, process_index: int = 0, process_count: int = 1,
                 depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._args = dict(global_batch=global_batch, seed=seed, process_index=process_index,
                          process_count=process_count)
        self._source = source
        TaskBatches(source, **self._args)  # checks the arguments now, not in the worker
        self.seed, self.step, self.depth = int(seed), 0, depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._pending: collections.deque[Future] = collections.deque()
        self._next = 0  # step of the next batch to submit

    def _build(self, step: int) -> dict:
        it = TaskBatches(self._source, **self._args)
        it.set_state({"seed": self.seed, "step": step})
        return next(it)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while len(self._pending) < self.depth + 1:
            self._pending.append(self._pool.submit(self._build, self._next))
            self._next += 1
        batch = self._pending.popleft().result()
        self.step += 1
        return batch

    def get_state(self) -> dict:
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpointed data seed {state['seed']} != configured seed {self.seed}")
        self._drop_pending()
        self.step = self._next = int(state["step"])

    def _drop_pending(self) -> None:
        for fut in self._pending:
            fut.cancel()
        self._pending.clear()

    def close(self) -> None:
        """Cancel what is queued and stop the worker (waits for the batch in progress)."""
        self._drop_pending()
        self._pool.shutdown(wait=True, cancel_futures=True)
