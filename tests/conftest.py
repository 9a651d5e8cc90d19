"""Test-wide JAX settings: 8 fake CPU devices and strict rank promotion."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
