"""One writer per claim folder: `ablate reproduce` (a fixed design or `--decide`) holds an
exclusive lock on OUT/.reproduce.lock for its whole run, so two runs never write one folder's
verdict.json and report.md in no order.

The lock is rundir.CellLock's (an open-file-description lock, released by the kernel when the
holder dies, kill -9 included: no stale lock is ever left behind). The file says who holds it
(pid, host, start time), for the one-line refusal of a second run; it is never removed, since a
lock file unlinked while another process opens it would let two runs hold "the" lock. Readers
(`--dry-run`, `ablate status`, `ablate report`) take no lock.
"""
from __future__ import annotations

import os
import socket
import stat
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ablate.core.bounded_read import kind_of
from ablate.core.errors import ConfigError
from ablate.core.rundir import CellLock

CLAIM_LOCK = ".reproduce.lock"
_HOLDER_BYTES = 300  # the holder line is under 100 bytes: read no more of a planted file
_held: dict[Path, "ClaimLock"] = {}  # folders this process holds: `all` takes every claim's first


class ClaimLock(CellLock):
    """CellLock on OUT/.reproduce.lock, its file naming the holder."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.path = Path(folder) / CLAIM_LOCK

    def acquire(self) -> bool:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        # a FIFO was locked and used, a folder refused with a bare OSError; a link is CellLock's refusal
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise ConfigError(f"{self.path} is {kind_of(mode)}; the lock file must be a plain file: remove it")
        if not super().acquire():
            return False
        info = os.fstat(self._fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:  # never write a file linked elsewhere
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{holder_line()}\n".encode(), 0)
        return True


def holder_line() -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}"


def read_holder(path: Path) -> str:
    """The holder line of the lock file at `path`, as one printable line; a holder that has not
    written it yet (it took the lock an instant ago) is said to be starting."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            raw = os.read(fd, _HOLDER_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError:
        raw = b""
    text = raw.decode("utf-8", "replace").split("\n", 1)[0]
    text = "".join(ch for ch in text if ch.isprintable()).strip()
    return text or "a run that is starting"


@contextmanager
def claim_lock(folder: Path):
    """Hold `folder`'s claim lock for the block; ConfigError (one line, exit 2) naming the holder
    when another process holds it. Nested for a folder this process already holds: no-op."""
    key = Path(os.path.abspath(folder))
    if key in _held:
        yield
        return
    lock = ClaimLock(folder)
    if not lock.acquire():
        raise ConfigError(f"{folder} is being written by another `ablate reproduce` ({read_holder(lock.path)}); "
                          "valid: wait for it to end (`ablate status` and `--dry-run` read the folder meanwhile), "
                          "or another --out")
    _held[key] = lock
    try:
        yield
    finally:
        del _held[key]
        lock.release()


@contextmanager
def claim_locks(folders: list[Path]):
    """Every folder's claim lock, taken before any run starts (`reproduce all`): a refusal comes
    before any claim has written anything."""
    with ExitStack() as stack:
        for folder in folders:
            stack.enter_context(claim_lock(folder))
        yield
