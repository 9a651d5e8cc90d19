"""Every generated table of docs/results.md re-renders from the committed rows to the same text: the report scripts
run on experiments/results/*.jsonl into a copy of the page (plots into a temporary folder), and each section
between its markers must equal the committed one. A failure means a row, a generator or the page changed alone:
re-render with `python -m experiments.reports.results` and commit the page with the change."""

import os
import pathlib
import re
import shutil

from experiments.reports import results

ROOT = pathlib.Path(__file__).parents[2]
SECTION = re.compile(r"(<!-- (\w+):begin .*?-->.*?<!-- \2:end -->)", re.S)


def sections(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in SECTION.finditer(text)}


def test_results_page_rerenders_from_the_committed_rows(tmp_path, monkeypatch):
    committed = (ROOT / "docs" / "results.md").read_text()
    (tmp_path / "docs").mkdir()
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    monkeypatch.chdir(tmp_path)  # plots land here; their links are relative to the page, as in the repository
    results.main(["--results_dir", str(ROOT / "experiments" / "results"), "--out", "docs/results.md",
                  "--plots_dir", os.path.join("experiments", "results")])
    want, got = sections(committed), sections((tmp_path / "docs" / "results.md").read_text())
    assert set(want) == {"classification", "lm", "retrieval"}
    for name in want:
        assert got[name] == want[name], f"the {name} section of docs/results.md does not re-render from its rows"
