"""The one reader of the JSON and TOML files the harness reads: run and cache state (config.json,
summary.json, grid.json, decide.json, speed.json, build records, backtest plans) and the grid,
claim and --config files a person gives it.

A file is refused, with one line naming it and what is wrong (UnreadableFile), when it is not
a regular file (a FIFO is opened without blocking, a device such as /dev/zero is never read),
when it is larger than its cap, when it does not decode or parse, when it nests deeper than
MAX_DEPTH, when it holds a number that is not finite (NaN, Infinity, 1e999) or an integer too
large for a float (a float() of it would overflow), or when its top level is not the type the
caller needs. Nothing else escapes: no RecursionError, no OverflowError, no MemoryError from
reading /dev/zero. What a refusal means is the caller's: a damaged cache is set aside and
rebuilt, a damaged input file ends the command in that one line (exit 2).

Standard library only: analysis reads run folders through it too.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from ablate.core.errors import ConfigError

MIB = 1 << 20
# The caps, declared once. A state file of one run or cache is a few KiB; 4 MiB is far above any.
STATE_BYTES = 4 * MIB
# grid.json and ladder.json list every cell with its options (a few hundred bytes a cell).
LISTING_BYTES = 64 * MIB
# A grid, claim or --config TOML file a person writes.
INPUT_BYTES = 1 * MIB
# One row of metrics.jsonl (a few hundred bytes when the harness writes it).
LINE_BYTES = 1 * MIB
# No file of the harness nests deeper than a handful of levels; deeper is damage (and would
# overflow the parser's or a reader's recursion).
MAX_DEPTH = 64
_PIECE = 1 << 16  # how much of a line is read at a time

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


class UnreadableFile(ConfigError):
    """A file that cannot be read as what its caller needs. str(e) is one line,
    `<path> cannot be read (<why>)`; `path` and `why` are kept for callers that say more."""

    def __init__(self, path: str | Path, why: str):
        self.path, self.why = Path(path), why
        super().__init__(f"{path} cannot be read ({why})")


class NotRegularFile(OSError):
    """`open_regular`'s refusal of a FIFO, a device, a folder or a socket: EINVAL, its kind in words."""


class _Refused(ValueError):
    """A value the parse hooks refuse; becomes UnreadableFile with the file's name."""


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words: `a FIFO, not a regular file`."""
    kind = next((word for test, word in _KINDS if test(mode)), "not a file")
    return f"{kind}, not a regular file"


def open_regular(path: str | Path, follow_links: bool = True) -> BinaryIO:
    """`path` opened for reading in binary if it is a regular file; OSError otherwise
    (NotRegularFile for a FIFO, a device, a folder). O_NONBLOCK: a FIFO is opened at once (and
    fstat says what it is), never waited on. follow_links=False refuses a symbolic link at
    `path` itself (OSError ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, kind_of(mode), str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_bounded(path: str | Path, follow_links: bool = True) -> BinaryIO:
    """`open_regular`, its refusals as UnreadableFile. FileNotFoundError passes through
    unchanged, so a caller can tell "none yet" from "damaged"."""
    try:
        return open_regular(path, follow_links)
    except FileNotFoundError:
        raise
    except NotRegularFile as e:
        raise UnreadableFile(path, e.strerror) from None
    except OSError as e:
        raise UnreadableFile(path, _os_reason(path, e)) from None


def _os_reason(path: str | Path, e: OSError) -> str:
    try:
        info = os.lstat(path)
    except OSError:
        return e.strerror or type(e).__name__
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link, not a regular file"
    return kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else (e.strerror or type(e).__name__)


def read_bytes(path: str | Path, limit: int = STATE_BYTES, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at `path`, refused (UnreadableFile) over `limit` bytes."""
    with open_bounded(path, follow_links) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            # What the file holds, not `limit` bytes: read(n) sets n bytes aside. It may grow meanwhile.
            data = f.read(min(size, limit) + 1)
            while len(data) <= limit and (more := f.read(min(_PIECE, limit + 1 - len(data)))):
                data += more
        except OSError as e:
            raise UnreadableFile(path, e.strerror or type(e).__name__) from None
    if len(data) > limit:
        raise UnreadableFile(path, f"larger than the {_size(limit)} such a file may hold")
    return data


def read_json(path: str | Path, top: type | tuple[type, ...] | None = dict, limit: int = STATE_BYTES,
              follow_links: bool = True) -> Any:
    """The JSON value in the file at `path`, checked as the module doc says; `top` is the type
    its top level must have (None: any)."""
    data = read_bytes(path, limit, follow_links)
    try:
        return parse_json(data, top)
    except _Refused as e:
        raise UnreadableFile(path, str(e)) from None


def read_toml(path: str | Path, limit: int = INPUT_BYTES) -> dict[str, Any]:
    """The TOML table in the file at `path` (TOML is UTF-8 by definition), checked as the
    module doc says."""
    data = read_bytes(path, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(path, _not_utf8(e)) from None
    try:
        value = tomllib.loads(text)
    except ValueError as e:  # TOMLDecodeError; an integer of more digits than int() takes
        raise UnreadableFile(path, f"not valid TOML: {_first_line(e)}") from None
    except RecursionError:
        raise UnreadableFile(path, f"nested deeper than {MAX_DEPTH} levels") from None
    try:
        _check_values(value)
    except _Refused as e:
        raise UnreadableFile(path, str(e)) from None
    return value


def parse_json(data: bytes | str, top: type | tuple[type, ...] | None = dict, finite: bool = True) -> Any:
    """`data` parsed as JSON and checked; a ValueError with a few words otherwise. For one line
    of a JSON-lines file, or a payload that is no file of its own. finite=False lets NaN and
    Infinity through (metrics rows an older version wrote), never deep nesting."""
    try:
        value = json.loads(data)  # NaN, Infinity and 1e999 parse: _check_values names where they sit
    except RecursionError:
        raise _Refused(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise _Refused(_not_utf8(e)) from None
    except ValueError as e:  # JSONDecodeError; an integer of more digits than int() takes
        raise _Refused(f"not valid JSON: {_first_line(e)}") from None
    _check_values(value, finite)
    if top is not None and not isinstance(value, top):
        raise _Refused(f"holds a JSON {_json_kind(value)}, where {_wanted(top)} belongs")
    return value


def bounded_lines(f: BinaryIO, limit: int = LINE_BYTES) -> Iterator[bytes | None]:
    """The lines of the open binary file `f`, each ending in its newline as read; None in place
    of a line longer than `limit` bytes (read past in pieces, never held whole)."""
    for line, _ in sized_lines(f, limit):
        yield line


def sized_lines(f: BinaryIO, limit: int = LINE_BYTES) -> Iterator[tuple[bytes | None, int]]:
    """bounded_lines's lines, each with its length in bytes (a reader that keeps offsets).
    Read in pieces of _PIECE bytes: readline(limit) would set aside `limit` bytes per line."""
    while piece := f.readline(_PIECE):
        size, pieces = len(piece), [piece]
        while not piece.endswith(b"\n") and (piece := f.readline(_PIECE)):
            size += len(piece)
            if pieces is not None:
                pieces.append(piece)
                if size > limit + 1:  # too long whatever follows: hold none of it
                    pieces = None
        if pieces is None or size - pieces[-1].endswith(b"\n") > limit:
            yield None, size
        else:
            yield b"".join(pieces), size


def _check_values(value: Any, finite: bool = True) -> None:
    """Refuse nesting deeper than MAX_DEPTH, non-finite floats (NaN, Infinity; 1e999 parses as
    inf) and integers too large for a float, naming where they sit (`a.lr = nan`), walking
    the value without recursion. A place is kept as (parent, key) and spelled only if refused."""
    stack: list = [(value, 1, None)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
            stack.extend((child, depth + 1, (where, key)) for key, child in item.items())
        elif isinstance(item, list):
            if depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
            stack.extend((child, depth + 1, (where, i)) for i, child in enumerate(item))
        elif finite and isinstance(item, float) and not math.isfinite(item):
            raise _Refused(f"{_spelled(where)} = {item}, which is no finite number")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > sys.float_info.max:
            raise _Refused(f"{_spelled(where)} is an integer too large for a number")


def _spelled(where) -> str:
    """`a.b[2].c` for a place kept as nested (parent, key) pairs; `the value` at the top."""
    parts = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "the value"


def _not_utf8(e: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:160]


def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "true/false", type(None): "null"}
    return next((name for t, name in names.items() if type(value) is t), "number")


def _wanted(top: type | tuple[type, ...]) -> str:
    kinds = top if isinstance(top, tuple) else (top,)
    return " or ".join("an object" if t is dict else "a list" if t is list else t.__name__ for t in kinds)


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n} bytes"
