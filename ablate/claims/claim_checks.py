"""A claim file checked completely when it loads (ablate/claims/claim_file.py load_claim calls
`check_data` on its TOML, then `check_claim` on what it parsed), so that nothing it declares can fail after its grid has trained: every number
finite, a rate's `than` inside (0, 1), the plot parameters tables, no more clauses than the
report has letters for. Each refusal is one ClaimError naming the
file, the key and what is valid. Its selectors against its grid are the engine's check
(ablate/claims/selectors.py: analysis never imports the engine), made when the shipped claims load.

`design_notes` is the design rule for stability and warmup clauses (docs/claims.md "Designs that
can show the effect"), read against the grid's cells when the claim meets its grid: rates close
enough to bracket an edge of stability, warmup long enough to matter, the base recipe (cosine
decay after warmup, gradient clipping at 1.0) unless the clause makes another an arm of its own.
Where the edges lie is known only after calibration runs; what can be read from the grid is
noted (shown beside the claim, never refusing it: a claim off the rule still runs, and its
futility waits on ablate/claims/design_checks.py). `axis_reasons` checks that every axis value of a
claim's grid file says why it is there.
"""
from __future__ import annotations

import math
import string
from typing import Any

import pandas as pd

from ablate.claims.claim_measures import MEASURES
from ablate.claims.selection import select

# The report names clauses (a), (b), ... (ablate/claims/claim_report.py): a claim has at most this many.
CLAUSE_LETTERS = string.ascii_lowercase
RATE_TEST = "binary"  # a measure whose values are 0/1 outcomes: its `than` is a rate


def check_data(data: dict, where: str) -> None:
    """Refuse (ClaimError) the file's TOML (`data`) where parse_claim would trip on it or let a
    non-finite number through; `where` is the file."""
    _check_finite(data, where)
    _check_tables(data, where)


def check_claim(claim, where: str) -> None:
    """Refuse (ClaimError) the parsed Claim where it could fail after its grid has trained."""
    _check_letters(claim, where)
    _check_thans(claim, where)
    _check_params(claim, where)


class ClaimError(ValueError):
    """A claim declaration that cannot be used; the message names the file and the key."""
def _fail(where: str, message: str):
    raise ClaimError(f"{where}: {message}")


def _check_finite(node: Any, where: str, path: str = "") -> None:
    """NaN or inf anywhere in the file: no key of a claim takes one."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_finite(value, where, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        _fail(where, f"{path} = {node!r}; valid: a finite number")


def _check_tables(data: dict, where: str) -> None:
    for key in ("plot_params", "why_params"):
        if key in data and not isinstance(data[key], dict):
            _fail(where, f"{key} = {data[key]!r} must be a table ({key} = {{ split = \"AXIS\", ... }})")
        at = data.get(key, {}).get("at")
        if at is not None and not isinstance(at, dict):
            _fail(where, f"{key}.at = {at!r} must be a table of axis = value")


def _check_letters(claim, where: str) -> None:
    if len(claim.clauses) > len(CLAUSE_LETTERS):
        _fail(where, f"{len(claim.clauses)} [[clause]] tables; valid: at most {len(CLAUSE_LETTERS)} (the report "
                     f"names clauses (a) to ({CLAUSE_LETTERS[-1]})): split the claim in two")


def _check_thans(claim, where: str) -> None:

    for label, c in comparisons(claim):
        if c.than is not None and MEASURES[c.measure].test == RATE_TEST and not 0 < c.than < 1:
            _fail(where, f"{label}: than = {c.than!r} for measure {c.measure!r}, a rate; valid: a number "
                         "strictly between 0 and 1")


# The design rule's numbers, declared once (ablate/claims/design_checks.py reads the same spacing).
from ablate.claims.design_checks import MAX_GAP_DECADES  # noqa: E402

MIN_WARMUP_SHARE = 0.2  # a warmup arm's length against its run's: 50 of 200 steps ended before the plateau's escape
BASE_SCHEDULE, BASE_GRAD_CLIP = "cosine", 1.0  # nanoGPT's: AdamW, warmup then cosine decay, clipping at 1.0


def design_notes(claim, cells) -> list[str]:
    """What a stability clause's grid lacks by the design rule, one line each; `cells`: one row
    per grid cell (analysis.claims.check_against_grid's). A comparison reading a stability
    measure over two or more rates is checked; one at a single rate names its condition itself."""
    notes = []
    for i, clause in enumerate(claim.clauses):
        problems: dict[str, list[str]] = {}  # problem -> the sides that have it, in order
        for c in clause.compare:
            if not MEASURES[c.measure].stability:
                continue
            for side in ("a", "b") if c.b is not None else ("a",):
                for problem in _side_problems(cells[select(cells, c.selector(side))], c, clause):
                    if side not in problems.setdefault(problem, []):
                        problems[problem].append(side)
        notes += [f"clause ({CLAUSE_LETTERS[i]}) {clause.label!r}, side {' and '.join(sides)}: {problem}"
                  for problem, sides in problems.items()]
    return notes


def _side_problems(cells, c, clause) -> list[str]:
    if "lr" not in cells or cells["lr"].nunique() < 2:
        return []
    problems = []
    rates = sorted(float(r) for r in cells["lr"].unique())
    gaps = [(lo, hi) for lo, hi in zip(rates, rates[1:]) if math.log10(hi / lo) > MAX_GAP_DECADES + 1e-9]
    if gaps:
        lo, hi = gaps[0]
        problems.append(f"rates {lo:g} and {hi:g} are {math.log10(hi / lo):.2f} decades apart; a stability clause's "
                        f"rates are at most {MAX_GAP_DECADES:.2f} apart (a 1-3-10 ladder's step), to bracket each arm's edge "
                        "of stability")
    if "warmup" in cells and "planned_steps" in cells:
        warm = cells[pd_numeric(cells["warmup"]) > 0]
        short = warm[pd_numeric(warm["warmup"]) < MIN_WARMUP_SHARE * pd_numeric(warm["planned_steps"])]
        long = warm[pd_numeric(warm["warmup"]) >= pd_numeric(warm["planned_steps"])]
        if not long.empty:  # was noted by nothing: the peak rate, the ladder's rung, is never trained at
            row = long.iloc[0]
            problems.append(f"warmup {int(row['warmup'])} of {int(row['planned_steps'])} steps is as long as the run "
                            "or longer: the rate never reaches the ladder's value")
        if not short.empty:
            row = short.iloc[0]
            problems.append(f"warmup {int(row['warmup'])} of {int(row['planned_steps'])} steps is under "
                            f"{MIN_WARMUP_SHARE:.0%} of the run: too short to matter")
    about = f"{clause.sentence} {clause.label} {c.label}".lower()
    if "schedule" in cells and not (cells["schedule"] == BASE_SCHEDULE).all() and "schedule" not in about \
            and "constant" not in about:
        problems.append(f"schedule {sorted(set(cells['schedule']) - {BASE_SCHEDULE})[0]!r} where the base recipe "
                        f"decays by {BASE_SCHEDULE} after warmup (a constant rate only as an arm of its own)")
    if "grad_clip" in cells and not (pd_numeric(cells["grad_clip"]) == BASE_GRAD_CLIP).all() and "clip" not in about:
        problems.append(f"grad_clip {sorted(set(pd_numeric(cells['grad_clip'])) - {BASE_GRAD_CLIP})[0]:g} where the "
                        f"base recipe clips at {BASE_GRAD_CLIP:g} (no clipping only as an arm of its own)")
    return problems


def pd_numeric(values):
    return pd.to_numeric(values, errors="coerce")


def axis_reasons(text: str) -> list[str]:
    """The axes of a grid file's [axes] table (and a scale's `axes = {...}`) whose line gives no
    reason: a reason is a comment on the line or on the comment lines just above it."""
    missing, in_axes, above = [], False, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_axes, above = stripped == "[axes]", False
            continue
        if stripped.startswith("#"):
            above = True
            continue
        key = stripped.split("=", 1)[0].strip() if "=" in stripped else ""
        if key and (in_axes or key == "axes") and "#" not in stripped and not above:
            missing.append(key)
        above = False
    return missing


def _check_params(claim, where: str) -> None:
    """A `params` key its measure does not read (`untill` for `until`) was ignored without a word."""
    for label, c in comparisons(claim):
        known = MEASURES[c.measure].params
        unknown = sorted(set(c.params) - set(known)) if known is not None else []
        if unknown:
            _fail(where, f"{label}: params key {unknown[0]!r} is not read by measure {c.measure!r}; valid: "
                         f"{', '.join(known) if known else 'no params'}")


def comparisons(claim) -> list[tuple[str, Any]]:
    return ([(f"clause {cl.label!r}, {c.label!r}", c) for cl in claim.clauses for c in cl.compare]
            + [(f"report {c.label!r}", c) for c in claim.report])
