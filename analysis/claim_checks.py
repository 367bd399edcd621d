"""A claim file checked completely when it loads (analysis/claims.py load_claim calls
`check_data` on its TOML, then `check_claim` on what it parsed), so that nothing it declares can fail after its grid has trained: every number
finite, a rate's `than` inside (0, 1), the plot parameters tables, no more clauses than the
report has letters for. Each refusal is one ClaimError naming the
file, the key and what is valid. Its selectors against its grid are the engine's check
(ablate/claim/selectors.py: analysis never imports the engine), made when the shipped claims load.
"""
from __future__ import annotations

import math
import string
from typing import Any

# The report names clauses (a), (b), ... (analysis/claim_report.py): a claim has at most this many.
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


def _fail(where: str, message: str):
    from ablate.analysis.claims import ClaimError

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
    from ablate.analysis.claim_measures import MEASURES

    for label, c in comparisons(claim):
        if c.than is not None and MEASURES[c.measure].test == RATE_TEST and not 0 < c.than < 1:
            _fail(where, f"{label}: than = {c.than!r} for measure {c.measure!r}, a rate; valid: a number "
                         "strictly between 0 and 1")


def comparisons(claim) -> list[tuple[str, Any]]:
    return ([(f"clause {cl.label!r}, {c.label!r}", c) for cl in claim.clauses for c in cl.compare]
            + [(f"report {c.label!r}", c) for c in claim.report])
