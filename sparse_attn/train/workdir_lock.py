"""One run per workdir: an exclusive `fcntl.flock` on `<workdir>/run.lock`.

Two runs on one workdir interleave `metrics.jsonl` and overwrite each other's checkpoints.
The kernel drops a flock when its process dies, so a lock left by a killed run never blocks;
the file only records who holds it, for the error message. Standard library only.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket

LOCK_FILE = "run.lock"


class WorkdirLockedError(RuntimeError):
    """Another live process is running in this workdir."""


def _owner(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip() or "unknown process"


@contextlib.contextmanager
def hold(workdir: str):
    """Hold the workdir's lock for the duration of the `with`; raise if another process holds it."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkdirLockedError(
                f"{workdir} is in use by another run ({_owner(fd)}); wait for it, stop it, or use another "
                f"workdir. The lock ({path}) is released when that process exits."
            ) from None
        os.ftruncate(fd, 0)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock; the file stays (deleting it would race a new holder)
