"""Entry points that speak to people: `--help` shows the script's docstring (what it runs, what it writes), and a
bad argument, a missing work directory or checkpoint is one line naming it, exit status 2, no traceback; a problem of
the environment (a work directory locked by another run, a checkpoint that cannot be written or read, a full or
read-only disk) is one line too, exit status 1.

    parser = cli.ArgumentParser(__doc__)

    @cli.entry_point
    def main(argv=None): ...

`SPARSE_ATTN_TRACEBACK=1` re-raises instead, for debugging.
"""

from __future__ import annotations

import argparse
import errno
import functools
import os
import sys

from sparse_attn.train.checkpoint import CheckpointRestoreError, CheckpointSaveError
from sparse_attn.train.workdir_lock import WorkdirLockedError

# What a user can cause and fix from the command line: the library's bad-input errors (ValueError naming the
# argument), files and directories that are not there.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)
# What the machine causes: fixed by waiting, freeing space or permissions, not by another argument.
ENVIRONMENT_ERRORS = (WorkdirLockedError, CheckpointSaveError, CheckpointRestoreError)
DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the script's docstring as its help text and one-line errors (`prog: error: ...`, exit 2)."""

    def __init__(self, doc: str | None = None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        kwargs.setdefault("prog", _prog_of(sys._getframe(1).f_globals))  # the script's module, not sys.argv[0]
        super().__init__(description=(doc or "").strip() or None, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse `type`: an int >= 1 (the parser's one-line error names the flag otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def step_range(text: str) -> tuple[int, int]:
    """An argparse `type`: "A:B" -> (A, B) with 0 <= A < B (the runners' `--profile_steps`)."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (two step numbers), got {text!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"expected 0 <= A < B, got {text!r}")
    return a, b


def add_profile_steps(parser) -> None:
    """The runners' `--profile_steps A:B` (`train_and_evaluate(..., profile_steps=)`)."""
    parser.add_argument("--profile_steps", type=step_range, metavar="A:B",
                        help="write a jax.profiler trace of steps A to B to <workdir>/profile (docs/training.md)")


def add_overrides(parser) -> None:
    """The runners' positional `FIELD=VALUE` config overrides (`studies.overrides`)."""
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="override any config field, e.g. model.num_layers=3 train.learning_rate=1e-3 "
                             "model.attention.0.radius=64 (stored with the run; a resume must not change them)")


def fail(prog: str, error: BaseException | str, status: int = 2) -> None:
    """Print `error` as one line for `prog` and exit with `status`."""
    text = " ".join(str(error).split()) or type(error).__name__
    print(f"{prog}: error: {text}", file=sys.stderr)
    raise SystemExit(status)


def _environment(error: BaseException) -> BaseException | None:
    """The environment problem behind `error`, if any: one of ENVIRONMENT_ERRORS, or a disk error (full, read-only,
    no permission), also when a library wrapped it (the cause chain is searched)."""
    seen = error
    while seen is not None:
        if isinstance(seen, ENVIRONMENT_ERRORS) or (isinstance(seen, OSError) and seen.errno in DISK_ERRNOS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _prog_of(module_globals: dict) -> str:
    """"python -m <module>" for the script's module, or for the package the user ran when that package's
    `__main__` runs the module (`python -m experiments.lm` runs experiments.lm.train: usage names the former)."""
    spec = module_globals.get("__spec__")  # run as `python -m pkg.mod`, __name__ is "__main__"
    name = (spec.name if spec is not None else module_globals.get("__name__", "")).removesuffix(".__main__")
    run = getattr(sys.modules.get("__main__"), "__spec__", None)
    invoked = run.name.removesuffix(".__main__") if run is not None else None
    if invoked and name.startswith(invoked + "."):
        name = invoked
    return "python -m " + name


def _prog(main) -> str:
    return _prog_of(main.__globals__)


def entry_point(main):
    """Wrap a script's `main(argv=None)`: user errors (USER_ERRORS) become one line and exit status 2, environment
    problems (`_environment`) one line and exit status 1; `SPARSE_ATTN_TRACEBACK=1` re-raises both."""

    @functools.wraps(main)
    def wrapped(argv=None, *args, **kwargs):
        try:
            return main(argv, *args, **kwargs)
        except USER_ERRORS as e:
            if os.environ.get("SPARSE_ATTN_TRACEBACK"):
                raise
            fail(_prog(main), e)
        except Exception as e:
            problem = _environment(e)
            if os.environ.get("SPARSE_ATTN_TRACEBACK") or problem is None:
                raise
            fail(_prog(main), e if problem is e else f"{e} ({problem})", status=1)

    return wrapped
