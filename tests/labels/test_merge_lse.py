"""`merge_lse` at the shape where jaxlib 0.10.2's CPU backend segfaulted on a broadcast-multiply-reduce.

The old `jnp.sum(out * w[..., None], axis)` crashed the process while running (o [2, 1, 64, S=2, 2, 2, 8], axis 3:
a k = 1 batch of 2 with landmarks under the bucketed executor's vmaps), so the check runs in a subprocess: a
regression fails this test with the exit status instead of killing the test worker.
"""

import subprocess
import sys

CHECK = """
import jax, jax.numpy as jnp, numpy as np
from sparse_attn.executors.softmax import merge_lse
o = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 64, 2, 2, 2, 8))
l = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 64, 2, 2, 2)).at[1, :, 45:].set(-jnp.inf)
out, lse = jax.block_until_ready(jax.jit(lambda o, l: merge_lse(o, l, axis=3))(o, l))
o, l = np.asarray(o, np.float64), np.asarray(l, np.float64)
m = np.max(l, axis=3, keepdims=True)
m = np.where(np.isfinite(m), m, 0.0)  # rows 45.. of sequence 1 have no part: out 0, lse -inf
e = np.exp(l - m)
tot = np.sum(e, axis=3, keepdims=True)
w = e / np.where(tot > 0, tot, 1.0)
np.testing.assert_allclose(np.asarray(out), np.sum(o * w[..., None], axis=3), rtol=1e-5, atol=1e-5)
with np.errstate(divide="ignore"):
    want = np.log(tot[:, :, :, 0]) + m[:, :, :, 0]
np.testing.assert_allclose(np.asarray(lse), want, rtol=1e-5, atol=1e-5)  # float32 vs float64
print("ok")
"""


def test_merge_lse_runs_where_the_fused_reduce_crashed():
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stderr[-2000:])
