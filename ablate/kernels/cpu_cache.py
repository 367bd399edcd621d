"""The built CPU kernel libraries in $ABLATE_CACHE/kernels, verified before they are loaded.

A shared library in a cache is code the harness runs (its constructors run when it loads),
and a crash or a full disk during a build can leave it cut short (loading that one dies of a
bus error). So each library has a build record beside it, `<library>.build.json`, with the
SHA-256 and size of the bytes the build wrote; a library is loaded only when it is a regular
file (not a link, a FIFO, a folder or a device) whose bytes are the recorded ones, and it is
loaded from the very file that was checked (/proc/self/fd), so no one can swap it in between.
Anything else is built again (ablate/kernels/cpu_build.py). Builds hold one lock on the
folder, so two processes never build at once, and whoever takes it removes what a build
killed mid-compile left (its tmp* folder).

A build record is a checksum, not an authentication: whoever can write the folder can plant a
library with a record that matches it. So the cache must be private to its user, and a
kernels folder (or the cache folder above it) that another user can write is not used at all
(not_private): the kernels' torch forms are computed instead, with one line saying why.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from ablate.core.bounded_read import UnreadableFile, read_json
from ablate.core.rundir import TEMPORARY_GLOB, open_regular, replace_atomic

RECORD = ".build.json"  # <library><RECORD>: what the build wrote
LOCK = ".build.lock"
BUILD_PREFIX = "tmp"  # a build's own folder of objects (tempfile's default prefix, as before)
MAX_BYTES = 256 << 20  # no build writes more: anything larger is not one of ours
_RECORD_BYTES = 4096


def record_path(library: Path) -> Path:
    return library.with_name(library.name + RECORD)


def _digest(f: BinaryIO) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    while chunk := f.read(1 << 20):
        size += len(chunk)
        if size > MAX_BYTES:
            raise ValueError(f"more than {MAX_BYTES} bytes")
        sha.update(chunk)
    return sha.hexdigest(), size


def _what_is(path: Path, e: OSError) -> str:
    """Why `path` could not be opened as a regular file, in words."""
    try:
        info = path.lstat()
    except OSError:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)!r}), not a library the harness built"
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISDIR: "a folder", stat.S_ISCHR: "a device", stat.S_ISBLK: "a device",
             stat.S_ISSOCK: "a socket"}
    kind = next((word for test, word in kinds.items() if test(info.st_mode)), None)
    return f"is {kind}, not a file" if kind else f"cannot be read ({e.strerror or e})"


def _recorded(library: Path) -> tuple[dict | None, str | None]:
    """(the build record, None) or (None, why it is not one)."""
    path = record_path(library)
    try:
        record = read_json(path, top=dict, limit=_RECORD_BYTES, follow_links=False)
    except FileNotFoundError:
        return None, "has no build record"
    except UnreadableFile as e:  # a link, a FIFO, too large, not JSON, nested thousands deep: rebuilt
        return None, f"has a damaged build record ({e.why})"
    except OSError as e:
        return None, f"has a damaged build record ({_what_is(path, e)})"
    if (not isinstance(record.get("sha256"), str)
            or type(record.get("bytes")) is not int):
        return None, "has a damaged build record (no sha256 and bytes)"
    return record, None


def open_verified(library: Path) -> tuple[BinaryIO | None, str | None]:
    """(the library opened for reading, None) when it is a regular file whose bytes match its
    build record; (None, None) when nothing is at its name; (None, why) otherwise. The caller
    loads it through the open file, then closes it."""
    try:
        f = open_regular(library, follow_links=False)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: the folder is not one (build_lock says so)
        return None, None
    except OSError as e:
        return None, _what_is(library, e)
    try:
        record, why = _recorded(library)
        if record is None:
            return None, why
        try:
            digest, size = _digest(f)
        except ValueError as e:
            return None, f"is not the library its build record names ({e})"
        except OSError as e:
            return None, f"cannot be read ({e.strerror or e})"
        if size != record["bytes"]:
            hint = "truncated?" if size < record["bytes"] else "not what was built"
            return None, f"does not match its build record ({size} bytes where {record['bytes']} were built: {hint})"
        if digest != record["sha256"]:
            return None, "does not match its build record (other bytes than were built)"
        f.seek(0)
        opened, f = f, None
        return opened, None
    finally:
        if f is not None:
            f.close()


def publish(built: Path, library: Path) -> None:
    """Move the library at `built` (in the same folder) to `library`, its build record first:
    a process killed between the two leaves a record that its library does not match, which
    the next run rebuilds. Whatever was at either name is replaced (a link, never its target)."""
    with open(built, "rb") as f:
        digest, size = _digest(f)
    record = {"library": library.name, "sha256": digest, "bytes": size}
    replace_atomic(record_path(library), lambda out: out.write((json.dumps(record, indent=2) + "\n").encode()))
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(library.lstat().st_mode):  # a folder at the name: os.replace cannot replace it
            shutil.rmtree(library)
    os.replace(built, library)


@contextlib.contextmanager
def build_lock(folder: Path):
    """Hold the folder's build lock (waiting for another process's build to end), after
    removing what builds killed before they finished left in it."""
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder, where the kernels are built", str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{folder / LOCK} is a symbolic link; the lock must be a plain file") from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel releases it when the holder dies, even by kill -9
        _remove_stale_builds(folder)
        yield
    finally:
        os.close(fd)


def _remove_stale_builds(folder: Path) -> None:
    """Under the build lock no build is running: every tmp* folder and temporary record is
    left from one that died. A link is removed, never followed."""
    for entry in folder.iterdir():
        try:
            info = entry.lstat()
            if entry.name.startswith(BUILD_PREFIX) and stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.match(TEMPORARY_GLOB) and not stat.S_ISDIR(info.st_mode):
                entry.unlink()
        except OSError:  # another cleaner got there first, or it cannot be removed: not ours to fail on
            continue


def not_private(folder: Path) -> str | None:
    """Why a library in `folder` may be another user's (None: only this user, or root, can
    write it or the cache folder it is in): a folder writable by all, by a group other than
    this user's own, or owned by another user."""
    for path in (folder, folder.parent):
        try:
            info = path.stat()
        except OSError:  # not made yet (a first build makes it, this user's own), or not ours to judge
            continue
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (os.geteuid(), 0):
            shared = f"is owned by another user (uid {info.st_uid})"
        elif mode & stat.S_IWOTH or (mode & stat.S_IWGRP and info.st_gid != os.getegid()):
            shared = f"is writable by other users (mode {mode:o})"
        else:
            continue
        return (f"{path} {shared}, so a library planted there would run: the kernel cache must be private "
                f"(valid: chmod go-w {path}, or another ABLATE_CACHE)")
    return None
