"""Test-wide JAX settings: 8 fake CPU devices on a 32-thread pool, strict rank promotion, unoptimised XLA:CPU code."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# XLA:CPU runs all 8 devices and their collectives on one pool of PJRT_NPROC threads (default: one per core); on
# 2 cores 8-device training deadlocked in an all-reduce within 2000 steps (sparse_attn/train/mesh.py).
os.environ.setdefault("PJRT_NPROC", "32")
# The suite compiles hundreds of small programs and runs each a few times, so XLA:CPU's backend (LLVM) optimisation
# costs more than it saves: measured 26.2 -> 17.2 CPU-s (plug-in encoder test), 28.0 -> 20.1 (LM train/resume),
# 31.5 -> 19.7 (an ABCA random-configuration case). Subprocesses the tests start inherit it.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
