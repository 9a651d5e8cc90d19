"""viz draws masks without touching the user's matplotlib backend (an inline Jupyter kernel keeps its own)."""

import pathlib
import subprocess
import sys

import numpy as np

from sparse_attn import viz


def test_import_keeps_the_backend():
    code = "import matplotlib; matplotlib.use('svg'); import sparse_attn.viz; print(matplotlib.get_backend())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "svg"


def test_plot_mask_writes_a_png(tmp_path):
    path = viz.plot_mask(np.tril(np.ones((8, 8), bool)), str(tmp_path / "m.png"), title="causal")
    assert pathlib.Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
