"""Every generated table of docs/results.md and of its companion files re-renders from the committed rows to the
same text: the report scripts run on experiments/results/*.jsonl into a copy of the page (plots and companion files
into a temporary folder), each section between its markers must equal the committed one, and each companion file
the committed file. A failure means a row, a generator or the page changed alone: re-render with
`python -m experiments.reports.results` and commit the page and the companion files with the change."""

import os
import pathlib
import re
import shutil

from experiments.reports import lm as report_lm
from experiments.reports import results
from experiments.reports.classification_tables import DETAILS_FILE

ROOT = pathlib.Path(__file__).parents[2]
SECTION = re.compile(r"(<!-- (\w+):begin .*?-->.*?<!-- \2:end -->)", re.S)
COMPANIONS = (DETAILS_FILE, *report_lm.DETAILS_FILES.values())


def sections(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in SECTION.finditer(text)}


def test_results_page_and_companions_rerender_from_the_committed_rows(tmp_path, monkeypatch):
    committed = (ROOT / "docs" / "results.md").read_text()
    (tmp_path / "docs").mkdir()
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    monkeypatch.chdir(tmp_path)  # plots and companions land here; links are relative to the page, as in the repository
    out_dir = os.path.join("experiments", "results")
    results.main(["--results_dir", str(ROOT / "experiments" / "results"), "--out", "docs/results.md",
                  "--plots_dir", out_dir, "--details_dir", out_dir])
    want, got = sections(committed), sections((tmp_path / "docs" / "results.md").read_text())
    assert set(want) == {"classification", "lm", "retrieval"}
    for name in want:
        assert got[name] == want[name], f"the {name} section of docs/results.md does not re-render from its rows"
    for name in COMPANIONS:
        assert (tmp_path / out_dir / name).read_text() == (ROOT / out_dir / name).read_text(), (
            f"experiments/results/{name} does not re-render from the rows")
    # The page links every companion file, and each link resolves in the repository.
    for name in COMPANIONS:
        assert f"]({os.path.join('..', out_dir, name)})" in committed and (ROOT / out_dir / name).is_file()
