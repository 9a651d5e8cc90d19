"""Generated sections of a markdown page: the text between a begin and an end marker is rewritten, the rest of
the page (hand-written prose, other generated sections) is kept."""

from __future__ import annotations

import os

TITLE = "# Results\n"


def write_section(out: str, text: str, *, markers: tuple[str, str], replaces: str | None = None) -> None:
    """Replace the text between `markers` in `out`; without the markers the section is appended (or the page
    created with `TITLE`). A page that starts with `replaces` (an older page this section used to be alone on)
    is overwritten."""
    begin, end = markers
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = ""
    if os.path.exists(out):
        with open(out) as f:
            old = f.read()
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    elif old.strip() and not (replaces and old.startswith(replaces)):
        new = old.rstrip("\n") + "\n\n" + block
    else:
        new = TITLE + "\n" + block
    with open(out, "w") as f:
        f.write(new)
