"""Ctrl-C (SIGINT) and preemption (SIGTERM): finish the step, save, then stop.

A KeyboardInterrupt raised inside a step call would drop the new state after the old one was
donated (deleted), leaving nothing to save; the default SIGTERM action kills the process at
once. So the first signal only sets a flag that the loop honours between steps.

The first signal also puts back the previous handlers, so a second signal acts at once and
skips the save: a second SIGINT raises KeyboardInterrupt where the program is (the loop's
`finally` still closes the checkpoint manager, finishing an earlier save already in flight),
a second SIGTERM kills the process (the default action). The last completed checkpoint stays
restorable either way (orbax renames a save into place only once it is complete).

A signal the process ignores stays ignored, as Python itself leaves it: a job started in the
background by a non-interactive shell (`cmd &`) ignores SIGINT, so a terminal's Ctrl-C is not
meant for it.
"""

from __future__ import annotations

import signal
import threading

EXIT_CODE_SIGTERM = 128 + signal.SIGTERM  # the shell's convention for "terminated by SIGTERM"


class Terminated(SystemExit):
    """Raised after a SIGTERM, once the interrupted step is saved; exits with status 143."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = EXIT_CODE_SIGTERM
        self.message = message

    def __str__(self) -> str:
        return self.message


class DeferredInterrupt:
    """Install with `install()` (main thread only); `requested` is the signal number or None."""

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
        self.signals = tuple(signals)
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():  # signals only work there
            return
        for s in self.signals:
            if signal.getsignal(s) is not signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = signum
        self.restore()  # a second signal takes the previous (immediate) action

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def stop(self, step: int, ckpt_dir: str) -> BaseException:
        """The exception that ends an interrupted run, after step `step` was saved."""
        name = signal.Signals(self.requested).name
        message = f"interrupted by {name} after step {step}; saved it to {ckpt_dir}"
        if self.requested == signal.SIGTERM:
            return Terminated(message)
        return KeyboardInterrupt(message)
