"""Writing a file without following a symbolic link planted at its name, and without a reader
ever seeing half of it: the engine's run folders (ablate.core.rundir) and analysis's reports and
exports all write this way. Standard library only: analysis never imports the engine.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Callable


def replace_atomic(path: Path, write: Callable[[BinaryIO], Any], fsync: bool = True) -> None:
    """Call `write(f)` on a fresh temporary file next to `path` (opened binary, O_EXCL |
    O_NOFOLLOW: never an existing file or a link), then rename it over `path`. A reader sees
    the old file or the new one, never half of one; a failed or interrupted write (a full
    disk) leaves `path` as it was and removes the temporary; a symlink at `path` is replaced,
    its target left alone."""
    path = Path(path)
    fd, tmp = create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """A report's text, replaced whole (replace_atomic) without fsync: a report is rewritten from
    its runs, so a crash costs a rerun, not a result."""
    replace_atomic(path, lambda f: f.write(text.encode()), fsync=False)


def create_temporary(path: Path) -> tuple[int, Path]:
    """A new file next to `path`, opened for writing. Not tempfile.mkstemp: that creates mode
    0600, and results on a shared machine must be readable by others like any other file
    (0666 less the umask, which the kernel applies to this open)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), tmp
        except FileExistsError:  # a name another writer drew: draw again
            continue


def output_folder(path: Path) -> Path:
    """Make `path` a folder to write into, as report's plots/ and export's default folders are:
    a symbolic link planted at its name is removed (never followed: its target is left as it
    was) and a real folder made in its place. Returns `path`. The ladder's grids/ and plots/ are
    made this way too."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path
