"""Runs every notebook top to bottom on a fresh Jupyter kernel, as a reader would, and checks how it is stored.

Each notebook is executed by nbclient on a new ipykernel kernel (the `python3` kernelspec, launched with this
interpreter): rich outputs and display hooks behave as in Jupyter, and any cell that raises fails the test with
the cell's traceback. A notebook must draw at least one picture (an `image/png` output) and is stored with its
outputs stripped. Render them for reading: see the README's "Notebooks" section.
"""

import os
import pathlib
import sys

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOK_DIR = pathlib.Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"quickstart", "abca", "labels", "noncrossing", "train_checkpoint_evaluate", "bring_your_own_model"}
CELL_TIMEOUT_S = 300  # a hung cell fails the test instead of the CI job


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def test_the_notebooks_are_all_here():
    assert {p.stem for p in NOTEBOOKS} >= EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(_code_cells(nb)):
        assert not cell.outputs, f"{path.name}: code cell {i} has stored outputs; store notebooks stripped"
        assert cell.execution_count is None, f"{path.name}: code cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_on_a_fresh_kernel(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # jupyter_client launches the native `python3` spec with sys.executable: the kernel sees this environment.
    kernel_cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert os.path.realpath(kernel_cmd[0]) == os.path.realpath(sys.executable), kernel_cmd

    env = dict(os.environ, TMPDIR=str(tmp_path))  # the notebooks' temporary work directories land in tmp_path
    env.pop("JAX_NUM_CPU_DEVICES", None)  # conftest's 8 fake devices are for the tests; a reader's kernel has one
    # The client owns its kernel: it starts it and shuts it down (and closes its channels) when done.
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)  # raises CellExecutionError (with the cell's traceback) if any cell fails

    outputs = [out for cell in _code_cells(nb) for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert images, f"{path.name} produced no picture (no image/png output)"
