"""Entry points that speak to people: `--help` shows the script's docstring (what it runs, what it writes), and a
bad argument, a missing work directory or checkpoint is one line naming it, exit status 2, no traceback.

    parser = cli.ArgumentParser(__doc__)

    @cli.entry_point
    def main(argv=None): ...

`SPARSE_ATTN_TRACEBACK=1` re-raises instead, for debugging.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

# What a user can cause and fix from the command line: the library's bad-input errors (ValueError naming the
# argument), files and directories that are not there.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the script's docstring as its help text and one-line errors (`prog: error: ...`, exit 2)."""

    def __init__(self, doc: str | None = None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("prog", _prog_of(sys._getframe(1).f_globals))  # the script's module, not sys.argv[0]
        super().__init__(description=(doc or "").strip() or None, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(prog: str, error: BaseException) -> None:
    """Print `error` as one line for `prog` and exit with status 2."""
    text = " ".join(str(error).split()) or type(error).__name__
    print(f"{prog}: error: {text}", file=sys.stderr)
    raise SystemExit(2)


def _prog_of(module_globals: dict) -> str:
    spec = module_globals.get("__spec__")  # run as `python -m pkg.mod`, __name__ is "__main__"
    name = spec.name if spec is not None else module_globals.get("__name__", "")
    return "python -m " + name.removesuffix(".__main__")


def _prog(main) -> str:
    return _prog_of(main.__globals__)


def entry_point(main):
    """Wrap a script's `main(argv=None)`: user errors (USER_ERRORS) become one line and exit status 2."""

    @functools.wraps(main)
    def wrapped(argv=None, *args, **kwargs):
        try:
            return main(argv, *args, **kwargs)
        except USER_ERRORS as e:
            if os.environ.get("SPARSE_ATTN_TRACEBACK"):
                raise
            fail(_prog(main), e)

    return wrapped
