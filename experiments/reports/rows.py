"""Reading the committed result rows: one JSON object a line, and the name of a row's mechanism.

A row names its kind of attention under `mechanism`: a classification mechanism (`dense`, `labels`,
`noncrossing_defect`, ...) or a budget-grid preset of the LM and retrieval grids (`local`, `labels_d8k2`,
`abca_fixed`, ...). Rows written before that key existed are read alike: classification rows named it `attention`
(a string), budget-grid and probe rows `variant`. Older names are read as they were written: the committed rows were
migrated, so a budget-grid row naming the preset `labels` (since renamed `labels_d8k2`, CHANGELOG.md) comes from
outside them.
"""

from __future__ import annotations

from sparse_attn.studies.cells import read_rows

__all__ = ["mechanism", "read_rows"]


def mechanism(row: dict) -> str | None:
    """The row's mechanism (or budget-grid preset), from `mechanism` or the key an older row used."""
    if row.get("mechanism") is not None:
        return row["mechanism"]
    if isinstance(row.get("attention"), str):  # classification rows before the rename
        return row["attention"]
    if row.get("variant") is not None:  # LM, retrieval and probe rows before the rename
        return row["variant"]
    return None
