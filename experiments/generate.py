"""Sample text from a byte-LM run's checkpoint with incremental decoding (per-layer KV caches, docs/generation.md).

    .venv/bin/python -m experiments.generate --workdir runs/lm_smoke --prompt "def " --num_tokens 200 \
        --temperature 0.8 --top_k 40 --seed 0

Restores the latest checkpoint (or `--step`) with the config stored in it (`sparse_attn/studies/restore.py`), prefills the
prompt and samples one byte at a time under `jit` with static cache shapes, streaming the text to stdout. Decoding
uses the checkpoint's train step, so step-scheduled layers decode in the phase they were trained in (label
attention decodes its hard phase; a warning says so when the checkpoint is still in an earlier phase). Reports
(stderr, and the returned dict) prefill time, decode tokens/s (after compilation) and the caches' bytes.
`--max_len` sizes the caches (default prompt + num_tokens); BigBird decodes exactly the full forward pass at that
length.

Writes: nothing; streams the sampled bytes to stdout and a JSON summary line.
"""

from __future__ import annotations

import codecs
import sys

import jax
import numpy as np

from sparse_attn.decode import LMDecoder
from sparse_attn.decode.sampling import check_sampling
from sparse_attn.studies import cli
from sparse_attn.studies.restore import CheckpointError, restore


def encode(prompt: str) -> np.ndarray:
    data = prompt.encode("utf-8")
    if not data:
        raise ValueError("the prompt must hold at least one byte")
    return np.frombuffer(data, np.uint8).astype(np.int32)[None]


def generate(workdir: str, prompt: str, num_tokens: int, *, step: int | None = None, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0, max_len: int | None = None,
             stream=None, echo_prompt: bool = False, log=None) -> dict:
    """Sample `num_tokens` bytes after `prompt`; `stream` (a text file) receives them as they are drawn (after the
    prompt itself with `echo_prompt`, once the checkpoint is restored)."""
    check_sampling(temperature, top_k, top_p)  # the arguments first: nothing is restored for a bad call
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    run = restore(workdir, step)
    if run.kind != "lm":
        raise CheckpointError(f"{workdir!r} is a {run.kind} run; generation needs a causal LM run")
    tokens = encode(prompt)
    max_len = tokens.shape[1] + num_tokens if max_len is None else max_len
    decoder = LMDecoder(run.model, batch=1, max_len=max_len, step=run.step)
    for warning in decoder.warnings:
        (log or _stderr)(f"warning: {warning}")
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # prints a multi-byte character whole
    if stream is not None and echo_prompt:
        stream.write(prompt)

    def on_token(tok):
        if stream is not None:
            stream.write(utf8.decode(bytes([int(jax.device_get(tok)[0])])))
            stream.flush()

    out = decoder.generate(tokens, num_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           on_token=on_token)
    if stream is not None:
        stream.write(utf8.decode(b"", final=True))
        stream.flush()
    new = np.asarray(out["tokens"][0]).astype(np.uint8).tobytes()
    return {"step": run.step, "prompt": prompt, "text": new.decode("utf-8", errors="replace"), "bytes": new,
            "prefill_s": out["prefill_s"], "tokens_per_s": out["tokens_per_s"], "cache_bytes": out["cache_bytes"],
            "max_len": max_len}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


@cli.entry_point
def main(argv=None) -> dict:
    parser = cli.ArgumentParser(__doc__)
    parser.add_argument("--workdir", required=True, help="an LM run's workdir (experiments.lm)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--prompt", default="def ", help="text to continue (UTF-8 bytes)")
    parser.add_argument("--num_tokens", type=int, default=200, help="bytes to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--top_k", type=int)
    parser.add_argument("--top_p", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_len", type=int, help="cache length (default prompt + num_tokens)")
    args = parser.parse_args(argv)
    out = generate(args.workdir, args.prompt, args.num_tokens, step=args.step, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_len=args.max_len, stream=sys.stdout,
                   echo_prompt=True)
    _stderr(f"\n-- step {out['step']}: {args.num_tokens} bytes, prefill {out['prefill_s'] * 1e3:.1f} ms, "
            f"decode {out['tokens_per_s']:.1f} tokens/s (after compilation), caches {out['cache_bytes']:,} bytes "
            f"(max_len {out['max_len']})")
    return out


if __name__ == "__main__":
    main()
