"""A TEST DOUBLE of analysis.sequential.decide_claim, for the runner's tests alone (never shipped
behaviour): deterministic, from the cells on disk, with the contract's shape
(/work/notes/45-contract.md): each clause asks for the cells its selectors name at LOOKS seeds,
and is "decided" once a look of DECIDED_AT seeds is complete. Its numbers (the mean final loss
of each side per look) come from the cells, so a verdict written from it shows whether the
cells' bits came out the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LOOKS = (3, 6, 12)
DECIDED_AT = 6


@dataclass
class Look:
    n_seeds: int
    seeds: list
    statistic: float | None
    boundary: float | None


@dataclass
class ClauseDouble:
    letter: str
    label: str
    looks: list
    decided: bool
    status: str
    why: str
    needs: list = field(default_factory=list)

    @property
    def next_seeds(self):
        return self.needs[0]["seed"] if self.needs else None


@dataclass
class DecisionDouble:
    clauses: list

    @property
    def done(self) -> bool:
        return all(c.decided for c in self.clauses)

    @property
    def headline(self) -> str:
        return "agrees (double)" if self.done else "cannot tell (double)"

    @property
    def next_cells(self) -> list:
        return [s for c in self.clauses for s in c.needs]

    def to_json(self) -> dict:
        from ablate.claims.claim_report import SCHEMA  # verdict.json's layout, with fewer keys

        return {"schema": SCHEMA, "double": True, "headline": self.headline,
                "clauses": [{"label": c.label, "status": c.status, "why": c.why,
                             "looks": [{"seeds": k.n_seeds, "statistic": k.statistic, "boundary": k.boundary}
                                       for k in c.looks]} for c in self.clauses]}


def _finished(cells, selector: dict, seeds) -> list | None:
    """The final losses of the finished cells `selector` names at `seeds`, or None if one is missing."""
    from ablate.claims.selection import select

    from ablate.core.rundir import DONE

    frame = cells[cells["status"].isin(DONE)]
    values = []
    for seed in seeds:
        rows = frame[select(frame, {**selector, "seed": seed})]
        if rows.empty:
            return None
        values.extend(rows["summary_final_val_loss"].astype(float).tolist())
    return values


def decide_double(claim, runs) -> DecisionDouble:
    out = []
    for i, clause in enumerate(claim.clauses):
        selectors = [c.selector(side) for c in clause.compare for side in ("a", "b") if c.selector(side)]
        looks = []
        for n in LOOKS:
            sides = [_finished(runs.cells, s, range(n)) for s in selectors]
            if any(v is None for v in sides):
                break
            means = [round(sum(v) / len(v), 6) for v in sides]
            looks.append(Look(n, list(range(n)), means[0] - means[-1], float(DECIDED_AT)))
            if n >= DECIDED_AT:
                break
        decided = bool(looks) and looks[-1].n_seeds >= DECIDED_AT
        n_next = next((n for n in LOOKS if n > (looks[-1].n_seeds if looks else 0)), None)
        needs = [] if decided or n_next is None else [{**s, "seed": list(range(n_next))} for s in selectors]
        out.append(ClauseDouble("abcdefgh"[i], clause.label, looks, decided, "agrees" if decided else "cannot tell",
                                f"the double decides at {DECIDED_AT} seeds", needs))
    return DecisionDouble(out)


def report_double(claim, out, decision, cells=None, stopped=""):
    path = out / "report.md"
    path.write_text(f"# {claim.name} (test double)\n\n{decision.headline}; stopped: {stopped}\n")
    return path
