"""Reading files a worker may still be writing, as the tool's own readers do: a test that polls
a metrics.jsonl while a grid runs can catch its last line half-written."""
import json
from pathlib import Path


def complete_lines(path: Path) -> list[bytes]:
    """The lines of `path` that end in a newline: a last line without one is still being
    written (or was cut by a kill) and is left out."""
    with open(path, "rb") as f:
        return f.read().split(b"\n")[:-1]


def complete_rows(path: Path) -> list[dict]:
    """The JSON objects of the complete lines of a .jsonl file (a line cut short is skipped)."""
    return [json.loads(line) for line in complete_lines(path) if line.strip()]
