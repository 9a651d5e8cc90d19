"""Executes every notebook's code cells in order (outputs are stored stripped), so the notebooks stay true."""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_is_stripped(path):
    nb = json.loads(path.read_text())
    namespace: dict = {"__name__": "__notebook__"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs"), f"{path.name}: store notebooks with outputs stripped"
        exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
