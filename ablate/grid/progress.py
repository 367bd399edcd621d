"""What a running grid shows: one bar over the cells to run and a status line per worker on a
terminal, plain lines otherwise; a line per finished cell always."""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Iterable

from tqdm import tqdm

from ablate.core.rundir import CELL_BUSY, CELL_SKIPPED, CELL_TRAINED, COMPLETED, DIVERGED, DONE, FAILED
from ablate.core.timefmt import fmt_time


def describe_result(outcome: str, summary: dict | None) -> tuple[str, str]:
    """(status, detail) for a line about a finished cell."""
    if outcome == CELL_BUSY:
        return CELL_BUSY, "running in another process"
    s = summary or {}
    status = s.get("status", FAILED)
    if status == COMPLETED:
        val = s.get("final_val_loss")
        detail = f"final loss {s.get('final_loss'):.4f}" if s.get("final_loss") is not None else "final loss n/a"
        detail += f", val {val:.4f}" if val is not None else ""
    elif status == DIVERGED:
        detail = f"diverged at step {s.get('diverged_at_step')}"
    else:
        attempts = s.get("attempts")
        detail = (s.get("error") or "unknown error") + (f" ({attempts} attempts)" if attempts else "")
    if outcome == CELL_SKIPPED:
        detail = f"already finished: {detail}"
    return status, detail


class Progress:
    """One bar over the cells to run (done / running / failed, ETA) and one status line per
    worker on a terminal; otherwise (or --quiet) plain lines. A line per finished cell always."""
    def __init__(self, name: str, to_run: int, slots: int, quiet: bool = False, stream=None):
        self.name, self.to_run, self.slots = name, to_run, slots
        self.counts: Counter = Counter()
        self.running: dict[int, str] = {}
        self.t0 = time.time()
        self.done = 0
        stream = stream or sys.stderr
        self.tty = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.bar = None
        self.lines: dict[int, Any] = {}
        if self.tty and to_run:
            self.bar = tqdm(total=to_run, desc=name, unit="cell", dynamic_ncols=True, file=stream,
                            bar_format="{desc}: {n_fmt}/{total_fmt} cells |{bar}| {elapsed}<{remaining}{postfix}")
            for slot in range(slots):
                self.lines[slot] = tqdm(total=0, bar_format="{desc}", position=slot + 1, leave=False,
                                        file=stream, desc=f"  worker {slot}: idle")
            self._postfix()

    def write(self, text: str) -> None:
        if self.bar is not None:
            tqdm.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def _postfix(self) -> None:
        if self.bar is not None:
            c = self.counts
            self.bar.set_postfix_str(
                f"done={sum(c[s] for s in DONE)} running={len(self.running)} failed={c[FAILED]}"
                + (f" busy={c[CELL_BUSY]}" if c[CELL_BUSY] else ""), refresh=True)

    def started(self, slot: int, cell_id: str) -> None:
        self.running[slot] = cell_id
        if slot in self.lines:
            self.lines[slot].set_description_str(f"  worker {slot}: {cell_id}", refresh=True)
        self._postfix()

    def set_running(self, cell_ids: Iterable[str]) -> None:
        """For backends that cannot see their workers (Ray, SLURM): the cells whose lock is held."""
        ids = list(cell_ids)
        if ids != list(self.running.values()):
            self.running = dict(enumerate(ids))
            self._postfix()

    def note(self, text: str) -> None:
        self.write(text)

    def finished(self, slot: int | None, cell_id: str, outcome: str, summary: dict | None,
                 seconds: float | None = None) -> str:
        self.running.pop(slot, None)
        status, detail = describe_result(outcome, summary)
        self.counts[status] += 1
        self.done += 1
        took = f"  ({fmt_time(seconds)})" if seconds is not None and outcome == CELL_TRAINED else ""
        self.write(f"[{self.done}/{self.to_run}] {status:<9} {cell_id}  {detail}{took}")
        if self.bar is not None:
            self.bar.update(1)
            if slot in self.lines:
                self.lines[slot].set_description_str(f"  worker {slot}: idle", refresh=True)
        self._postfix()
        return status

    def close(self) -> None:
        for line in self.lines.values():
            line.close()
        if self.bar is not None:
            self.bar.close()
        self.lines, self.bar = {}, None
