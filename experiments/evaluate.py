"""Evaluate a run's checkpoint (byte LM or classifier) on its validation data or on a given text file.

    .venv/bin/python -m experiments.evaluate --workdir runs/lm_smoke               # latest step, its validation set
    .venv/bin/python -m experiments.evaluate --workdir runs/lm_smoke --step 250 --text notes.txt

The run's configuration is read from the checkpoint (every checkpoint stores it, `sparse_attn/train/run_config.py`),
the model is rebuilt from it and the train state restored; no flags repeat the training command. Metrics are the
training run's evaluation metrics, computed by the same functions at the checkpoint's train step (so step-scheduled
layers, label attention, run the phase they were trained in): LM validation `nll` and `bits_per_byte` over the same
`eval_batches` windows; classifier accuracy (per ListOps depth / Dyck distance bucket) and loss over the same
validation examples. `--text FILE` (LM only) evaluates every whole `seq_len` window of that file instead.
A missing workdir, a workdir without checkpoints, an absent step, a checkpoint without a stored config, a config
naming a field this code does not know, or arrays that do not fit the model the config describes each raise an
error naming the problem (`CheckpointError`).

Writes: nothing; prints the metrics as one JSON line.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn import data as data_lib
from sparse_attn.data import tasks as tasks_lib
from sparse_attn.data.corpus import DOC_SEPARATOR
from sparse_attn.studies import classification as cm
from sparse_attn.studies import cli
from sparse_attn.studies import lm as lm_objective
from sparse_attn.studies.restore import CheckpointError, Restored, from_json, restore  # noqa: F401 — tests and generate
from sparse_attn.studies.tasks import task_buckets


def _mean_metrics(eval_fn, model, step: int, batches: Iterable[dict]) -> tuple[dict, int]:
    graphdef, state = nnx.split(model)

    @jax.jit
    def one(state, batch):
        m = eval_fn(nnx.merge(graphdef, state), batch, jnp.int32(step))
        return {k: jnp.asarray(v, jnp.float32) for k, v in m.items()}

    sums, n = None, 0
    for batch in batches:
        m = one(state, jax.tree.map(jnp.asarray, batch))
        sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
        n += 1
    if n == 0:
        raise ValueError("no evaluation batch")
    return {k: float(v) / n for k, v in jax.device_get(sums).items()}, n


def text_windows(path: str, *, seq_len: int, global_batch: int, max_batches: int | None = None):
    """Every whole `seq_len + 1`-byte window (non-overlapping) of a file, or of a folder's text files joined in path
    order by NUL bytes (the files `--text` trains on: `TextSource`'s suffixes), in batches; the last partial batch
    dropped."""
    if os.path.isdir(path):
        suffixes = data_lib.TextSource(path=path).suffixes
        files = sorted(p for p in pathlib.Path(path).rglob("*") if p.is_file() and p.suffix in suffixes)
        if not files:
            raise FileNotFoundError(f"no files ending in {suffixes} under {path!r}")
        tokens = np.frombuffer(DOC_SEPARATOR.join(p.read_bytes().replace(DOC_SEPARATOR, b"") for p in files), np.uint8)
    elif os.path.isfile(path):
        with open(path, "rb") as f:
            tokens = np.frombuffer(f.read(), np.uint8)
    else:
        raise FileNotFoundError(f"no text file or folder {path!r}")
    windows = (tokens.size - 1) // seq_len
    if windows < global_batch:
        raise ValueError(f"{path!r} ({tokens.size} bytes) holds {windows} windows of {seq_len + 1} bytes, fewer "
                         f"than one batch of {global_batch}")
    num = windows // global_batch if max_batches is None else min(windows // global_batch, max_batches)
    for i in range(num):
        starts = (np.arange(global_batch) + i * global_batch) * seq_len
        rows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        yield {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


def evaluate_lm(run: Restored, text: str | None = None, max_batches: int | None = None) -> dict:
    tc = run.train
    if text is not None:
        batches, source = text_windows(text, seq_len=tc.seq_len, global_batch=tc.global_batch,
                                       max_batches=max_batches), text
    else:
        corpus = from_json(run.stored["data"], path="data").load()
        fingerprint = lm_objective.corpus_fingerprint(corpus)
        if fingerprint != run.stored["corpus"]:
            raise CheckpointError(f"the run's validation data changed since it was trained: stored "
                                  f"{run.stored['corpus']}, now {fingerprint}")
        num = tc.eval_batches if max_batches is None else min(max_batches, tc.eval_batches)
        batches = data_lib.eval_batches(corpus.valid_U8, global_batch=tc.global_batch, seq_len=tc.seq_len,
                                        num_batches=num)
        source = "validation"
    metrics, n = _mean_metrics(lm_objective.eval_fn, run.model, run.step, batches)
    return {"kind": "lm", "step": run.step, "data": source, "batches": n, **metrics}


def evaluate_classifier(run: Restored) -> dict:
    tc, stored = run.train, run.stored
    task = from_json(stored["task"], path="task")
    buckets = task_buckets(task)
    valid = tasks_lib.eval_batches(task.source("validation"), global_batch=tc.global_batch,
                                   num_examples=stored["num_validation"])
    eval_fn = cm.make_eval_fn(run.model_config, tc.seq_len, buckets)
    sums, n = _mean_metrics(eval_fn, run.model, run.step, valid)
    m = run.model_config
    out = cm.summarize(sums, buckets, heads=m.num_heads, head_dim=m.model_dim // m.num_heads)
    return {"kind": "classify", "step": run.step, "task": stored["task_name"], "batches": n,
            "accuracy": out["accuracy"], "valid_loss": out["valid_loss"],
            "accuracy_by_bucket": out.get("accuracy_by_bucket")}


def evaluate(workdir: str, step: int | None = None, text: str | None = None, max_batches: int | None = None) -> dict:
    run = restore(workdir, step)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    if run.kind == "lm":
        return evaluate_lm(run, text, max_batches)
    if run.kind == "retrieval":
        raise CheckpointError(f"{workdir!r} is a retrieval run: its runner evaluates it (experiments.retrieval) and "
                              "python -m experiments.retrieval.diagnose probes it")
    if text is not None:
        raise ValueError("--text evaluates byte LMs; this checkpoint is a classifier (it uses its task's data)")
    return evaluate_classifier(run)


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--workdir", required=True, help="the training run's workdir")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--text", help="LM runs: evaluate on this text file instead of the validation set")
    parser.add_argument("--max_batches", type=cli.positive_int, help="evaluate at most this many batches")
    args = parser.parse_args(argv)
    result = evaluate(args.workdir, args.step, args.text, args.max_batches)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
