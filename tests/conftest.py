"""Test-wide JAX settings: 8 fake CPU devices on a 32-thread pool, strict rank promotion, unoptimised XLA:CPU code."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# XLA:CPU runs all 8 devices and their collectives on one pool of PJRT_NPROC threads (default: one per core); on
# 2 cores 8-device training deadlocked in an all-reduce within 2000 steps (sparse_attn/train/mesh.py).
os.environ.setdefault("PJRT_NPROC", "32")
# The suite compiles hundreds of small programs and runs each a few times, so XLA:CPU's backend (LLVM) optimisation
# costs more than it saves: measured 26.2 -> 17.2 CPU-s (plug-in encoder test), 28.0 -> 20.1 (LM train/resume),
# 31.5 -> 19.7 (an ABCA random-configuration case). Subprocesses the tests start inherit it.
# The next three cut compile time further (the ABCA core's packed fwd+bwd program is ~1.2M characters of HLO): no
# fusion emitters, one LLVM codegen module instead of parallel splits, no expensive LLVM passes. Measured on 2 cores,
# each run beside one LM training job: tests/abca/test_abca_core.py 193 -> 138 s; the whole suite (pytest -n 2)
# 1265 -> 708 s, 731 passed both times. Alone, `bash .ci/run` on a fresh clone: 731 passed in 450 s.
_TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_llvm_disable_expensive_passes=true",
)
os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""), *_TEST_XLA_FLAGS)).strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
