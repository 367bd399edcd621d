"""Small, crash-safe file operations for run directories."""
from __future__ import annotations

import fcntl
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError

CONFIG, METRICS, SUMMARY, CHECKPOINT, LOCK = "config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", ".lock"


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN: metrics write a non-finite float as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`:
    a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = create_temporary(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_temporary(path: Path) -> tuple[int, Path]:
    """A new file next to `path`, opened for writing. Not tempfile.mkstemp: that creates mode
    0600, and results on a shared machine must be readable by others like any other file
    (0666 less the umask, which the kernel applies to this open)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # a name another writer drew: draw again
            continue


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


class CellLock:
    """An exclusive, non-blocking flock on `<run_dir>/.lock`. The kernel releases it when
    the holding process dies, even by kill -9, so a dead run never leaves a cell stuck."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def is_held_elsewhere(self) -> bool:
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
