"""Small, crash-safe file operations for run directories.

Nothing here follows a symbolic link it is about to write through: temporaries are created
fresh (O_EXCL | O_NOFOLLOW) and renamed over their target (a rename replaces a link, never
its target), and the lock file is opened with O_NOFOLLOW.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import stat
import struct
from pathlib import Path
from typing import Any

# The safe writes live with analysis, which writes reports and exports the same way but never
# imports the engine; the engine imports them from there.
from ablate.analysis.safe_files import create_temporary, replace_atomic  # noqa: F401  (part of this module's API)
from ablate.errors import ConfigError

CONFIG, METRICS, SUMMARY, CHECKPOINT, LOCK = "config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", ".lock"
# Temporaries that writers killed mid-write (kill -9, a full disk) may leave behind.
TEMPORARY_GLOB = ".*.tmp"
LEGACY_TEMPORARIES = ("checkpoint.tmp", "metrics.tmp")
# A run's status in its summary.json: DONE runs are results and are never trained again; a
# failed run is tried again. A cell folder without summary.json is running (its lock is held by
# a live process) or pending.
COMPLETED, DIVERGED = "completed", "diverged"
DONE = (COMPLETED, DIVERGED)
FAILED = "failed"
FINISHED = DONE + (FAILED,)
RUNNING, PENDING = "running", "pending"


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN: metrics write a non-finite float as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as indented JSON, atomically (replace_atomic). JSON has no inf or NaN: such a
    value is refused (ValueError) before anything is written."""
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    replace_atomic(path, lambda f: f.write(text.encode()))


def remove_stale_temporaries(run_dir: Path) -> None:
    """Remove what writers that died mid-write left in `run_dir`. Call it holding the cell's
    lock: no live writer is using them then. A link is removed, never its target."""
    run_dir = Path(run_dir)
    for tmp in [*run_dir.glob(TEMPORARY_GLOB), *(run_dir / n for n in LEGACY_TEMPORARIES)]:
        try:
            if not stat.S_ISDIR(tmp.lstat().st_mode):
                tmp.unlink()
        except FileNotFoundError:
            pass


def check_out_path(out: Path, target: Path) -> None:
    """Refuse an --out that cannot hold `target` (itself or a folder below it) before anything
    is written: the nearest part of the path that exists must be a folder we can write in."""
    for path in (target, *target.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            where = "" if path == out else f": {path}"
            raise ConfigError(f"--out {out}{where} is a file, not a folder; valid: a folder, or a path that "
                              "does not exist yet")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"--out {out}: cannot write in {path}; valid: a folder you can write to")
        return


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


# struct flock for fcntl(2) on Linux: l_type, l_whence, l_start, l_len, l_pid (padded to 32 bytes).
_FLOCK = "hhqqi4x"


def _whole_file(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)


class CellLock:
    """An exclusive, non-blocking lock on `<run_dir>/.lock`: an open-file-description lock
    (fcntl F_OFD_SETLK, Linux). The kernel releases it when the holding process dies, even by
    kill -9, so a dead run never leaves a cell stuck. Unlike flock, it can be tested without
    being taken (F_OFD_GETLK), so checking a cell's status never makes it look busy to a
    trainer locking it at that instant; and network file systems (NFS, Lustre) see it across
    machines. The file is opened with O_NOFOLLOW: a .lock that is a link is refused."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, flags | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ConfigError(f"{self.path} is a symbolic link (to {os.readlink(self.path)!r}); the lock file "
                                  "must be a plain file: remove the link") from None
            raise

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open(os.O_RDWR | os.O_CREAT)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _whole_file(fcntl.F_WRLCK))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:  # never truncate a file linked elsewhere
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # for a human looking: who holds it
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor of the description releases the lock
            self._fd = None

    def is_held_elsewhere(self) -> bool:
        """Whether another open file description (another process, or another CellLock in
        this one) holds the lock. Takes no lock itself."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # no lock file (or a link, which no trainer can lock): nobody holds it
            return False
        try:
            answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _whole_file(fcntl.F_WRLCK))
        finally:
            os.close(fd)
        return struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK
