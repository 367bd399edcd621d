"""The run folder: its file names, its status words, summary.json's schema, a run's status,
"is this the same run?", and the small, crash-safe file operations that write it.

Everything that reads or writes a run folder imports these facts from here, analysis too: this
module is standard library only, so reading results never imports torch. docs/run-directory.md
describes the folder for people.

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
from typing import Any, Iterable, Mapping

from ablate.core import bounded_read
from ablate.core.bounded_read import LISTING_BYTES, STATE_BYTES, open_regular  # noqa: F401  (part of this module's API)
from ablate.core.errors import ConfigError
# The safe writes (safe_files.py, which reports and exports use too), re-exported: the engine
# imports them from here.
from ablate.core.safe_files import create_temporary, replace_atomic  # noqa: F401  (part of this module's API)

# ------------------------------------------------------------------------------ file names

CONFIG, METRICS, SUMMARY, CHECKPOINT, LOCK = "config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", ".lock"
# A grid folder holds one run folder per cell, and grid.json (kept under .grid.lock).
GRID_JSON, GRID_LOCK = "grid.json", ".grid.lock"
# Temporaries that writers killed mid-write (kill -9, a full disk) may leave behind.
TEMPORARY_GLOB = ".*.tmp"
LEGACY_TEMPORARIES = ("checkpoint.tmp", "metrics.tmp")

# ------------------------------------------------------------------------------ status words

# A run's status in its summary.json: DONE runs are results and are never trained again; a
# failed run is tried again. A cell folder without summary.json is running (its lock is held by
# a live process) or pending; a pending cell that has logged steps is interrupted (`ablate
# status` says so; it resumes on a rerun).
COMPLETED, DIVERGED = "completed", "diverged"
DONE = (COMPLETED, DIVERGED)
FAILED = "failed"
FINISHED = DONE + (FAILED,)
RUNNING, PENDING = "running", "pending"
INTERRUPTED = "interrupted"
STATUSES = FINISHED + (RUNNING, PENDING)  # what `status` answers (and grid.json records)
# What one call did with a cell (cell.CellOutcome): trained it (to any status above), found it
# finished, or found another process training it.
CELL_TRAINED, CELL_SKIPPED, CELL_BUSY = "trained", "skipped", "busy"

# ------------------------------------------------------------------------------ summary.json

# Every summary.json has SUMMARY_KEYS; RESULT_KEYS are its numbers (null when the run has
# none: a failed run, or a diverged one's losses). The three keys after these appear only when
# they apply.
RESULT_KEYS = ("final_loss", "final_val_loss", "diverged_at_step", "steps", "wall_time_s")
SUMMARY_KEYS = ("status", *RESULT_KEYS, "error")
MISSING_STEPS = "missing_steps"  # logged steps whose metrics rows a resume lost (train.py)
STOPPED_DEAD = "stopped_dead_at_step"  # the step a run stopped at, found dead (the option stop_dead)
ATTEMPTS = "attempts"  # how many times a failed cell was tried (cell.py)


def run_summary(status: str, final_loss: float | None, final_val_loss: float | None, diverged_at_step: int | None,
                steps: int, wall_time_s: float, missing_steps: Iterable[int] = (),
                stopped_dead_at_step: int | None = None) -> dict[str, Any]:
    """The summary.json of a run that trained to its end (COMPLETED), or stopped early as dead
    (COMPLETED, `stopped_dead_at_step`: the option stop_dead), or diverged."""
    assert status in DONE, status
    missing = list(missing_steps)
    return {"status": status, "final_loss": final_loss, "final_val_loss": finite_or_none(final_val_loss),
            "diverged_at_step": diverged_at_step, "steps": steps, "wall_time_s": wall_time_s, "error": None,
            **({MISSING_STEPS: missing} if missing else {}),
            **({STOPPED_DEAD: stopped_dead_at_step} if stopped_dead_at_step is not None else {})}


def failed_summary(error: str, attempts: int) -> dict[str, Any]:
    """The summary.json of a cell recorded failed: no result, its last error as one line, and
    how many attempts it has had."""
    return {"status": FAILED, **dict.fromkeys(RESULT_KEYS), "error": error, ATTEMPTS: attempts}


def summary_status(summary: Mapping[str, Any] | None) -> str | None:
    """The status a summary.json's content gives its run: None when there is no summary; a
    word of FINISHED; FAILED for a summary without one (damaged: not a result, tried again)."""
    if summary is None:
        return None
    status = summary.get("status")
    return status if status in FINISHED else FAILED


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """summary.json's content: None when there is none, {} when it is damaged (not a JSON
    object in a regular file), which summary_status reads as FAILED."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None
    try:
        return read_json(path, top=dict)
    except (OSError, ValueError):  # bounded_read.UnreadableFile is a ValueError
        return {}


# ------------------------------------------------------------------------------ a run's status


def finished_status(run_dir: str | Path) -> str | None:
    """completed | diverged: the run is finished and never run again; failed: a summary that
    says so (or cannot be read), tried again; None: no summary, resumed or started."""
    return summary_status(read_summary(run_dir))


def status(run_dir: str | Path) -> str:
    """One of STATUSES, from the run folder alone: its summary.json's status; else running
    when another process holds its lock; else pending (not started, or interrupted)."""
    finished = finished_status(run_dir)
    if finished is not None:
        return finished
    return RUNNING if CellLock(run_dir).is_held_elsewhere() else PENDING


# ------------------------------------------------------------------------------ "is this the same run?"

# config.json records the run's options in `train`, but some of them as resolved elsewhere: the
# variant by its id, the depth the model has, the init it used, the data by its fingerprint,
# what `auto` picked. Each such option is compared where it is recorded.
RECORDED_AT: dict[str, tuple[str, ...]] = {
    "variant": ("variant", "id"), "layers": ("model", "n_layer"), "width": ("model", "d_model"),
    "init": ("model", "init"),
    "data": ("data", "fingerprint"), "kernels": ("kernels",), "device": ("device",), "dtype": ("dtype",),
}
# config.json `identity_keys` lists the options that define the run (ablate/engine/config.py's
# experiment role); analysis pairs only cells equal in them. A config written before it did
# defined the run by these:
SETTING_KEYS = ("model", "layers", "steps", "lr", "warmup", "schedule", "min_lr_ratio", "batch_size", "seq_len",
                "weight_decay", "beta1", "beta2", "grad_clip", "diverge_factor")


def identity_keys(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The options a config.json says define its run (SETTING_KEYS for an older one)."""
    keys = config.get("identity_keys")
    if not isinstance(keys, list):
        return SETTING_KEYS
    return tuple(k for k in keys if isinstance(k, str))


def identity(config: Mapping[str, Any], compared: Mapping[str, Any]) -> dict[str, Any]:
    """What must match for a run folder to hold the run asked for, from a config.json (or the
    record of one a run would write). `compared`: option name -> its default, the options that
    change the numbers or what is logged (the engine derives them from ablate/engine/config.py). An
    option a config written before it existed lacks had its default there: the option's
    definition is that its default changes nothing. One recorded as resolved (RECORDED_AT) is
    read where it is recorded, and not compared when an older config lacks it."""
    train = json_object(config.get("train"))
    ident = {k: train.get(k, default) for k, default in compared.items() if k not in RECORDED_AT}
    for key, (section, *inner) in RECORDED_AT.items():
        value = config.get(section)
        for name in inner:
            value = json_object(value).get(name)
        if value is not None:
            ident[key] = value
    return ident


def differing(old: Mapping[str, Any], new: Mapping[str, Any], compared: Mapping[str, Any]) -> list[str]:
    """The options in which two runs differ (none: the same run), as `identity` compares them."""
    a, b = identity(old, compared), identity(new, compared)
    return [k for k in b if k in a and a[k] != b[k]]


def json_object(value: Any) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else an empty one: a damaged field is no crash."""
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------------------ reading and writing


def file_version(path: Path) -> tuple | None:
    """Which file is at `path` (None: none): every write renames a new file into place (a new
    inode), so a different answer means someone wrote it since."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_dev, info.st_mtime_ns


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


def read_json(path: Path, top: type | tuple[type, ...] | None = None) -> Any:
    """JSON from a regular file of a run or grid folder, through the one bounded reader
    (ablate/core/bounded_read.py): a FIFO, a device, a file over its cap, non-finite numbers or deep
    nesting raise UnreadableFile (a ValueError), a missing file FileNotFoundError. grid.json
    lists every cell, so it has the larger cap."""
    limit = LISTING_BYTES if Path(path).name == GRID_JSON else STATE_BYTES
    return bounded_read.read_json(path, top=top, limit=limit)


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
