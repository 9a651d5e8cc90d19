"""Test-wide JAX settings: 8 fake CPU devices, strict rank promotion, unoptimised XLA:CPU code."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# The suite compiles hundreds of small programs and runs each a few times, so XLA:CPU's backend (LLVM) optimisation
# costs more than it saves: measured 26.2 -> 17.2 CPU-s (plug-in encoder test), 28.0 -> 20.1 (LM train/resume),
# 31.5 -> 19.7 (an ABCA random-configuration case). Subprocesses the tests start inherit it.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
