"""`ablate reproduce CLAIM --decide [--budget 30m]`: seeds added in looks until each clause is decided.

The statistics are ablate/claims/sequential.py's: `decide_claim(claim, runs)` applies a group-
sequential design over its LOOKS to whatever cells the grid folder holds, recomputed from the
run directories at every call, and names the cells the next look needs (only for the clauses
still undecided: the cells their selectors name; for a best-rate clause, the chosen rates on
fresh seeds). This module runs the looks: the grid's own design first (the quick run, so a
`--quick` already run is the first look), then each look's cells, on the grid machinery (the
claim's grid folder, its cell locks, resume on rerun, any backend). A look whose estimated
time does not fit in what is left of --budget is not started.

decide.json (OUT/decide/) is this module's record: the cells of each look started and the
seconds spent, so that a rerun after an interruption (kill -9 included) finishes the look it
was in without asking the budget again, and counts the time already spent. It holds no
decision: decisions come from the cells alone, so the rerun ends on the same verdict.json. A
decide.json that does not match this claim, scale and overrides, or does not parse, is set
aside (named on the output) and the budget starts afresh. A look the record names as started
is finished without asking the budget only if one of its unfinished cells was taken by a
trainer (has a run folder): a record left by a run refused before training spends nothing.

Exit status: 0 (1 if a cell failed) once the looks have decided, a "cannot tell" at the last
look included; UNDECIDED when they stopped before deciding (the budget spent, cells busy or
unfinished, a look left): its verdict.json says why, and a rerun resumes.
"""
from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ablate.analysis.load import load_runs
from ablate.claims.design import DECIDE_DIR, design_grid, own_seeds, selected_ids, subset
from ablate.claims.options import UNDECIDED
from ablate.claims.plan import look_seconds, plan_design, print_plan, workers_of
from ablate.claims.sequential import decide_claim
from ablate.claims.spending import LOOKS
from ablate.core.errors import ConfigError
from ablate.core.rundir import DONE, finished_status, read_json, write_json_atomic
from ablate.core.safe_files import replace_atomic
from ablate.core.timefmt import fmt_time

DECIDE_JSON = "decide.json"
DECIDE_VERSION = 1
ALL_DECIDED = "every clause decided"
FIRST_RUN = "the rate sweep"  # a best-rate claim's first run: its grid's own seeds choose the rates


# ------------------------------------------------------------------------------ the record


@dataclass
class LookLog:
    """decide.json: which looks were started (each look's cell ids) and the seconds spent."""

    key: dict  # what the record belongs to: claim, scale, overrides
    looks: list = field(default_factory=list)  # per look started: sorted cell ids
    seconds: float = 0.0  # spent by this and earlier runs

    @classmethod
    def load(cls, path: Path, key: dict) -> tuple["LookLog", str]:
        """The record at `path` if it is this design's; else a fresh one and why."""
        if not path.is_file():
            return cls(key), ""
        try:
            data = read_json(path)
            ok = (data.get("version") == DECIDE_VERSION and data.get("key") == key
                  and all(isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in data["looks"])
                  and 0 <= float(data["seconds"]) < math.inf)  # "1e999" as a string too
        except (OSError, ValueError, AttributeError, TypeError, KeyError):  # UnreadableFile is a ValueError
            ok = False
        if not ok:
            return cls(key), f"{path}: not this design's record (or damaged): set aside, the budget starts afresh"
        return cls(key, [list(ids) for ids in data["looks"]], float(data["seconds"])), ""

    def was_started(self, index: int, ids: list[str]) -> bool:
        return index < len(self.looks) and self.looks[index] == sorted(ids)

    def start(self, index: int, ids: list[str]) -> None:
        self.looks = (self.looks + [[]] * index)[:index] + [sorted(ids)]  # a look done before may be skipped

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"version": DECIDE_VERSION, "key": self.key, "looks": self.looks,
                                 "seconds": round(self.seconds, 1)})


class Budget:
    """Wall time left of --budget, counting what earlier runs of this design spent."""
    def __init__(self, seconds: float | None, spent_before: float):
        self.seconds, self.before, self.t0 = seconds, spent_before, time.monotonic()

    def spent(self) -> float:
        return self.before + time.monotonic() - self.t0

    def refusal(self, estimate: float, what: str) -> str:
        """Why `what` (estimated `estimate` seconds) is not started; "" when it fits."""
        if self.seconds is None:
            return ""
        left = self.seconds - self.spent()
        if estimate <= left:
            return ""
        return (f"budget: {what}, about {fmt_time(estimate)}, does not fit in the {fmt_time(max(left, 0))} left of "
                f"{fmt_time(self.seconds)}")


# ------------------------------------------------------------------------------ the looks


def unfinished(cells: Path, ids: list[str]) -> list[str]:
    """The cells of `ids` that have not ended completed or diverged."""
    return [i for i in ids if finished_status(cells / i) not in DONE]


def taken(cells: Path, ids: list[str]) -> bool:
    """Whether a trainer ever took one of the cells `ids` (its lock made its run folder): the
    evidence, beside decide.json's record, that a look was started and spent time."""
    return any((cells / i).is_dir() for i in ids)


def design_key(claim, req) -> dict:
    return {"claim": claim.name, "scale": req.scale, "overrides": {k: str(v) for k, v in sorted(req.overrides.items())}}


def next_look(claim, req, first, decision) -> tuple:
    """(grid, cell ids) of the cells `decision.next_cells` names, the grid loaded at the seeds
    those name (its own seeds too, so its cells keep the ids they have)."""
    named = {int(s) for sel in decision.next_cells
             for s in (sel.get("seed") if isinstance(sel.get("seed"), list) else [sel.get("seed", 0)])}
    grid = design_grid(claim, req.scale, req.overrides, seeds=sorted(set(own_seeds(first)) | named),
                       imports_policy=req.imports_policy)
    return grid, selected_ids(grid, decision.next_cells)


def run_look(claim, cells: Path, req, grid, ids: list[str], index: int, log: LookLog, budget: Budget,
             out: Path, name: str) -> tuple[int | None, str]:
    """Run look `index` (the cells `ids` of `grid`, printed as `name`). Returns (grid exit status,
    or None when nothing was run; why the looks stop here, or "")."""
    from ablate.grid.runner import run_grid  # lazy: torch only when used

    todo = unfinished(cells, ids)
    if not todo:
        return None, ""
    what = f"{name} ({len(todo)} cell{'s' if len(todo) != 1 else ''} to train)"
    if not (log.was_started(index, ids) and taken(cells, todo)):  # a look started before is finished whatever is left
        refused = budget.refusal(look_seconds(subset(grid, todo), req) if req.budget is not None else 0.0, what)
        if refused:
            return None, refused
        log.start(index, ids)
    log.seconds = budget.spent()
    log.write(out / DECIDE_JSON)
    print(f"{claim.name}: {what}, {len(ids)} cells in all -> {cells}", flush=True)
    status = run_grid(subset(grid, ids), cells, req.options)
    log.seconds = budget.spent()
    log.write(out / DECIDE_JSON)
    left = unfinished(cells, ids)
    if status != 2 and left:
        return status, (f"{name}'s cells did not all finish ({len(left)} left, e.g. {left[0]}); rerun to "
                        "resume")
    return status, ""


def run_decide(claim, cells: Path, req, grid=None, decide_fn=None, report_fn=None):
    """Run the looks into the grid folder `cells` until every clause is decided, no look is
    left, the budget is spent or a look's cells could not finish; then write OUT/decide/.
    `decide_fn`, `report_fn`: analysis.sequential.decide_claim and
    claim_report.write_decision_report unless given (tests). Returns (exit status, Decision)."""
    out = cells / DECIDE_DIR
    if decide_fn is None:  # the shipped statistics, at the plan --looks names (a continuation keeps the past)
        looks = getattr(req, "looks", None) or _default_looks()
        decide_fn = functools.partial(_shipped_decide(), looks=looks, kept_from=plan_of(out, looks))
    first = grid or plan_design(claim, cells, req)
    print_plan(claim, first, cells, req)
    if req.dry_run:
        return _dry_run(claim, first, cells, req, out)
    log, note = LookLog.load(out / DECIDE_JSON, design_key(claim, req))
    if note:
        print(note, flush=True)
    budget = Budget(req.budget, log.seconds)
    index, grid, ids, worst, decision = 0, first, [c.id for c in first.cells], 0, None
    while True:
        name = look_name(claim, index, first=grid is first)
        status, stopped = run_look(claim, cells, req, grid, ids, index, log, budget, out, name)
        if status == 2:
            return 2, None
        worst = max(worst, status or 0)
        if stopped and decision is None and index == 0 and status is None:
            raise ConfigError(f"--budget: {stopped.removeprefix('budget: ')}; nothing was run; valid: a budget "
                              "that fits the first look")
        if stopped:
            break
        decision = decide_fn(claim, _runs(cells))
        if decision.done:
            stopped = ALL_DECIDED if all(c.decided for c in decision.clauses) else "no look left"
            break
        grid, next_ids = next_look(claim, req, first, decision)
        if set(next_ids) <= set(ids):  # nothing new to run: the statistics need cells that cannot finish
            stopped = f"{name}'s cells are all run and the decision asks for no new cell"
            break
        index, ids = look_index(decision, index + 1), next_ids
    write_decision(claim, cells, out, decision, stopped, log, report_fn)
    return (worst if decision is not None and decision.done else UNDECIDED), decision


def look_index(decision, default: int) -> int:
    """The statistical look the decision asks for next (0-based in spending.LOOKS), read from
    the seeds it names: a rerun that finds earlier looks' cells on disk jumps to that look."""
    looks = tuple(getattr(decision, "looks", None) or _default_looks())
    sizes = [len(c.next_seeds) for c in decision.clauses if c.next_seeds]
    return looks.index(max(sizes)) if sizes and max(sizes) in looks else default


def _default_looks() -> tuple:
    return LOOKS


def plan_looks(out: Path) -> tuple | bool:
    """The looks of the plan recorded in `out`/verdict.json; True (the default plan) where it names
    none readable."""
    try:
        looks = tuple(int(n) for n in read_json(out / "verdict.json", top=dict)["looks"])
    except (OSError, ValueError, TypeError, KeyError):
        return True
    return looks or True


def plan_of(out: Path, looks: tuple) -> tuple | None:
    """kept_from for analysis.sequential: (the plan an earlier --decide of this folder read, how
    many of its looks any clause read), when `looks` differs from it; None for a fresh plan or
    the same one. The past looks keep their boundaries (an error-spending continuation); a plan
    that does not start with the looks already read is refused."""
    path = out / "verdict.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path, top=dict)
        if data.get("continues") and tuple(data["looks"]) == tuple(looks):  # a continuation keeps what it kept
            return tuple(int(n) for n in data["continues"][0]), int(data["continues"][1])
        old = tuple(int(n) for n in data["looks"])
        read = max((len(c["looks"]) for c in data["clauses"]), default=0)
    except (OSError, ValueError, AttributeError, TypeError, KeyError, IndexError):
        raise ConfigError(f"{path}: not a --decide verdict (damaged); valid: a folder whose decide/verdict.json "
                          "parses, or none") from None
    if old == tuple(looks) or read == 0:
        return None
    if tuple(looks[:read]) != old[:read]:
        raise ConfigError(f"--looks {','.join(map(str, looks))} does not continue the plan {','.join(map(str, old))} "
                          f"this folder's --decide read ({read} look(s)); valid: looks starting "
                          f"{','.join(map(str, old[:read]))}")
    if read >= len(old):  # the plan's last look was read: its alpha is spent, added looks could not decide
        raise ConfigError(f"--looks {','.join(map(str, looks))}: this folder's --decide already read the last look "
                          f"({old[-1]} seeds) of its plan {','.join(map(str, old))}, which spent all of alpha, so "
                          f"more looks could not decide; valid: a longer plan declared before the last look, or a "
                          f"new --out with the longer plan from the start")
    return old, read


def _runs(cells: Path):
    return load_runs(cells)


def look_name(claim, index: int, first: bool) -> str:
    """"look N", but for the grid's own design of a claim read at best rates: its seeds choose the
    rates and are never tested, so its looks (fresh seeds) start after it, at look 1."""
    return FIRST_RUN if first and any(c.best_lr for c in claim.compare) else f"look {index + 1}"


def _shipped_decide():
    return decide_claim


def _dry_run(claim, first, cells: Path, req, out: Path):
    from ablate.bench.dry_run import dry_run  # lazy: torch only when used

    dry_run(first, cells, workers_of(req))
    budget = f" or until --budget {req.budget / 60:.1f} min is spent" if req.budget is not None else ""
    print(f"{look_name(claim, 0, first=True)} is the grid's own design above; then looks add seeds only to the "
          f"clauses still undecided, until each is decided{budget}; report and verdict -> {out}")
    return 0, None


# ----------------------------------------------------------------------------- the output


def write_decision(claim, cells: Path, out: Path, decision, stopped: str, log: LookLog, report_fn=None) -> None:
    """verdict.json (the decision and why the looks stopped: the same bytes whenever the cells
    are the same), report.md (the statistics' own report), decide.json; and the summary."""
    out.mkdir(parents=True, exist_ok=True)
    log.write(out / DECIDE_JSON)
    if decision is None:
        print(f"{claim.name}: no decision: {stopped}", flush=True)
        return
    verdict = {**decision.to_json(), "stopped": stopped}
    text = json.dumps(verdict, indent=2, default=str) + "\n"
    replace_atomic(out / "verdict.json", lambda f: f.write(text.encode()), fsync=False)
    report_fn = report_fn or _shipped_report()
    report = report_fn(claim, out, decision, cells=cells, stopped=stopped)
    print(f"{claim.name}: {decision.headline}; stopped: {stopped} ({log.seconds / 60:.1f} min spent); "
          f"report: {report}", flush=True)
    for c in decision.clauses:
        looks = ", ".join(f"{look.n_seeds} seeds: {_g(look.statistic)} vs {_g(look.boundary)}" for look in c.looks)
        print(f"  ({c.letter}) {c.label}: **{c.status}** ({looks or 'no look'}); {c.why}", flush=True)


def _g(x) -> str:
    """A look's z or boundary: "-" for none, 0 unsigned (a p of 1/2 gives z = -0.0)."""
    return "-" if x is None else f"{x + 0.0:.3g}"


def _shipped_report():
    from ablate.claims.decision_report import write_decision_report  # lazy: matplotlib, seaborn only when used

    return write_decision_report


def write_decision_index(entries: list, path: Path) -> Path:
    """`ablate reproduce all --decide`'s index: each claim's decision, a line per clause (its
    outcome, the seeds it took and why it stopped), a link to its report."""
    lines = ["# Claims: seeds until decided", "", "Each claim's report has every look's figures and plot.", ""]
    for claim, out, decision in entries:
        link = Path(os.path.relpath((out / "report.md").resolve(), path.parent.resolve())).as_posix()
        lines += [f"## {claim.name}: {decision.headline if decision else 'not run'}", "", f"> {claim.statement}", "",
                  f"Source: {claim.source}. [Report]({link})", ""]
        if decision is not None:
            lines += [f"- ({c.letter}) {c.label}: **{c.status}** at {c.seeds_used} seeds; {c.why}"
                      for c in decision.clauses]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    replace_atomic(path, lambda f: f.write(text.encode()), fsync=False)
    return path
