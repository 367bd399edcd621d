"""A metrics.jsonl read twice instead of held: first an index of its rows (each step's byte
offset, 16 bytes a step) and the set of its keys, then the rows themselves, one at a time, in
step order. `ablate export` reads a run this way, so a run's metrics never have to fit in
memory (held as Python rows, a 300 MB file took about 2.75 GB).

    with MetricsIndex.open(path, cell_id, skipped) as metrics:
        metrics.keys, metrics.last_step, metrics.steps_after(s)
        for row in metrics.rows_after(s): ...

The file stays open between the two reads, so a run that is resumed meanwhile (its file
replaced) or goes on appending cannot shift a row under its recorded offset.
"""
from __future__ import annotations

import warnings
from array import array
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ablate.analysis.load import parse_metrics_line, scan_metrics
from ablate.core.rundir import METRICS

# Both dashboards (TensorBoard, W&B) store a step as a signed 64-bit integer.
STEP_RANGE = range(-(2**63), 2**63)


class MetricsIndex:
    """The distinct steps of a metrics.jsonl, ascending, each with the offset of its last line
    (the line a resumed run wrote when it continued past an earlier one), and every key."""

    def __init__(self, file, steps: np.ndarray, offsets: np.ndarray, keys: frozenset[str]):
        self._file, self.steps, self.offsets, self.keys = file, steps, offsets, keys

    @classmethod
    def open(cls, path: Path, cell_id: str, skipped: list[str]) -> "MetricsIndex":
        """Index `path` (read_metrics's rules for bad lines). A row whose step no dashboard can
        hold is left out with a warning naming it. A missing file is an empty index."""
        steps, offsets, keys, too_large = array("q"), array("q"), set(), []
        file = open(path, "rb") if path.is_file() else None
        for offset, row in scan_metrics(file, cell_id, skipped) if file else ():
            if row["step"] not in STEP_RANGE:
                too_large.append(row["step"])
                continue
            steps.append(row["step"])
            offsets.append(offset)
            keys.update(row)
        if too_large:
            message = (f"{cell_id}: skipped {len(too_large)} row(s) of {METRICS} whose step ({too_large[0]}) "
                       "is outside a 64-bit integer")
            warnings.warn(message, stacklevel=2)
            skipped.append(message)
        all_steps = np.frombuffer(steps, dtype=np.int64) if steps else np.zeros(0, np.int64)
        # np.unique keeps the first of equal values: on the reversed file, that is each step's last line.
        distinct, first_from_end = np.unique(all_steps[::-1], return_index=True)
        last = len(all_steps) - 1 - first_from_end
        all_offsets = np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, np.int64)
        return cls(file, distinct, all_offsets[last], frozenset(keys - {"step"}))

    @property
    def last_step(self) -> int | None:
        return int(self.steps[-1]) if len(self.steps) else None

    def steps_after(self, step: int) -> np.ndarray:
        return self.steps[np.searchsorted(self.steps, step, side="right"):]

    def rows_after(self, step: int) -> Iterator[dict[str, Any]]:
        """The rows with a step above `step`, one per step, in step order, read one at a time."""
        for offset in self.offsets[np.searchsorted(self.steps, step, side="right"):]:
            self._file.seek(int(offset))
            row, _ = parse_metrics_line(self._file.readline())
            if row is not None:  # only a file cut in place since the index could say otherwise
                yield row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> "MetricsIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
