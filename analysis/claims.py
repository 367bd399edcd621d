"""One verdict engine for every claim: a declaration (variants/claims/NAME.toml) + a grid's
run directory -> "agrees", "does not agree" or "cannot tell with N seeds (about M would
tell)", with the numbers.

A claim declares what it compares: each `[[compare]]` entry names a measure (registered in
claim_measures.py), the cells of side `a` and side `b` (axis values; `at` applies to both;
a list means any of its values), or a number `than` in place of `b`, and what the claim
expects: `a` "higher" or "lower" than `b`, or "equal" within `margin`. `[[report]]` entries
are computed and shown the same way but take no part in the verdict.

How one comparison is decided (alpha 0.05 unless the claim sets `alpha`):
  pairing     cells pair by key: the seed and every other axis that varies in the grid, except
              the axes that tell a from b and those the measure aggregates over
  higher /    two-sided paired t-test on the per-key differences a - b (one-sample against
  lower       `than`); for a 0/1 measure (diverged) the exact McNemar test (scipy binomtest on
              the discordant pairs). After Holm's correction across the claim's comparisons:
              p < alpha in the expected direction -> agrees, in the other -> does not agree,
              else cannot tell
  equal       TOST (two one-sided t-tests) against +-margin: the 90% interval of the mean
              difference inside the margin with Holm-adjusted p < alpha -> agrees; a mean
              difference outside the margin and significantly beyond it -> does not agree;
              else cannot tell
  seeds that  the smallest number of seeds at which the test would reach 80% power for the
  would tell  observed effect, at alpha / (number of comparisons) (the Bonferroni bound on
              Holm's first step): noncentral t for t-tests, the exact binomial power for McNemar

The claim agrees when every comparison agrees, does not agree when any does not, and
otherwise cannot tell, with the fewest seeds any undecided comparison had and the most any
would need. Nothing here trains or imports the model: it reads what the grid wrote
(ablate.analysis.load_runs).
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ablate.analysis.claim_measures import MEASURES, Context, Measure, MeasureUnavailable, values_by_key
from ablate.analysis.load import DONE, Runs, load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.analysis.selection import COLUMN_OF, SelectionError, select
from ablate.analysis.stats import (DEFAULT_ALPHA, DEFAULT_POWER, MAX_SEEDS, Interval, adjust_p_values, bootstrap_ci,
                                   discordant_pairs, format_p, mcnemar_exact, mcnemar_pairs_for_power,
                                   one_sample_p_value, one_sided_seeds_for_power, seeds_for_power, tost)

AGREES, DISAGREES, CANNOT_TELL = "agrees", "does not agree", "cannot tell"
EXPECTATIONS = ("higher", "lower", "equal")
CORRECTION = "holm"  # the claim is a conjunction of its comparisons: family-wise error control
CLAIM_KEYS = {"name", "statement", "source", "source_figures", "grid", "plot", "plot_params", "compare", "report",
              "alpha"}
COMPARE_KEYS = {"label", "measure", "params", "at", "a", "b", "than", "expect", "margin"}


class ClaimError(ValueError):
    """A claim declaration that cannot be used; the message names the file and the key."""


# ------------------------------------------------------------------------ declarations


@dataclass(frozen=True)
class Compare:
    label: str
    measure: str
    a: dict
    b: dict | None
    than: float | None
    expect: str
    at: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    margin: float | None = None

    def selector(self, side: str) -> dict:
        return {**self.at, **(self.a if side == "a" else self.b or {})}

    @property
    def split_keys(self) -> set:
        """The axes that tell a from b (not part of the pairing key)."""
        return set(self.a) | set(self.b or {})


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    source: str
    source_figures: str
    grid: str  # a shipped grid name or a TOML path
    compare: tuple  # of Compare: what the verdict is made of
    report: tuple = ()  # of Compare: shown beside it, not part of it
    plot: str | None = None  # a plot kind of claim_plots.PLOTS
    plot_params: dict = field(default_factory=dict)
    alpha: float = DEFAULT_ALPHA
    path: str | None = None


def load_claim(path: str | Path) -> Claim:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ClaimError(f"{path}: unreadable claim ({' '.join(str(e).split())})") from None
    return parse_claim(data, str(path))


def parse_claim(data: dict[str, Any], where: str = "claim") -> Claim:
    def fail(message):
        raise ClaimError(f"{where}: {message}")

    unknown = set(data) - CLAIM_KEYS
    if unknown:
        fail(f"unknown key {sorted(unknown)[0]!r}; valid: {', '.join(sorted(CLAIM_KEYS))}")
    for key in ("name", "statement", "source", "grid"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            fail(f"{key!r} must be a non-empty string")
    from ablate.analysis.claim_plots import PLOTS

    if data.get("plot") is not None and data["plot"] not in PLOTS:
        fail(f"plot {data['plot']!r} is not a plot kind; valid: {', '.join(PLOTS)}")
    entries = []
    for table in ("compare", "report"):
        items = data.get(table, [])
        if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
            fail(f"[[{table}]] must be a list of tables")
        entries.append(tuple(_parse_compare(e, f"{where}: [[{table}]][{i}]") for i, e in enumerate(items)))
    if not entries[0]:
        fail("a claim needs at least one [[compare]]")
    alpha = data.get("alpha", DEFAULT_ALPHA)
    if not isinstance(alpha, float) or not 0 < alpha < 1:
        fail(f"alpha {alpha!r} must be a number between 0 and 1")
    return Claim(data["name"], data["statement"], data["source"], str(data.get("source_figures", "none given")),
                 data["grid"], entries[0], entries[1], data.get("plot"), dict(data.get("plot_params", {})), alpha,
                 where if where.endswith(".toml") else None)


def _parse_compare(entry: dict, where: str) -> Compare:
    def fail(message):
        raise ClaimError(f"{where}: {message}")

    unknown = set(entry) - COMPARE_KEYS
    if unknown:
        fail(f"unknown key {sorted(unknown)[0]!r}; valid: {', '.join(sorted(COMPARE_KEYS))}")
    if entry.get("measure") not in MEASURES:
        fail(f"measure {entry.get('measure')!r} is not registered; valid: {', '.join(MEASURES)}")
    if entry.get("expect") not in EXPECTATIONS:
        fail(f"expect {entry.get('expect')!r}; valid: {', '.join(EXPECTATIONS)}")
    for key in ("a", "b", "at", "params"):
        if key in entry and not isinstance(entry[key], dict):
            fail(f"{key!r} must be a table of axis = value")
    if not entry.get("a"):
        fail("'a' must select some cells (axis = value)")
    if ("b" in entry) == ("than" in entry):
        fail("give exactly one of 'b' (cells) or 'than' (a number)")
    if "than" in entry and not isinstance(entry["than"], (int, float)):
        fail("'than' must be a number")
    if entry["expect"] == "equal":
        if not isinstance(entry.get("margin"), (int, float)) or entry["margin"] <= 0:
            fail("expect = 'equal' needs a positive 'margin' (the equivalence bound, in the measure's unit)")
        if MEASURES[entry["measure"]].test != "t":
            fail("expect = 'equal' needs a continuous measure (TOST)")
    return Compare(str(entry.get("label") or entry["measure"]), entry["measure"], dict(entry["a"]),
                   dict(entry["b"]) if "b" in entry else None,
                   float(entry["than"]) if "than" in entry else None, entry["expect"], dict(entry.get("at", {})),
                   dict(entry.get("params", {})), float(entry["margin"]) if "margin" in entry else None)


# ------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Result:
    compare: Compare
    unit: str
    test: str  # the test's name as the report states it
    seeds: tuple  # the seeds among the paired keys
    n_pairs: int
    n_a: int  # keys with a value on each side
    n_b: int
    mean_a: float | None
    mean_b: float | None  # `than` for a one-sample comparison
    diff: float | None  # mean of the paired differences a - b
    interval: Interval | None  # of diff: bootstrap 95% (TOST: the t-based 90%)
    p_value: float | None  # before correction
    outcome: str = CANNOT_TELL
    p_adjusted: float | None = None
    seeds_needed: int | None = None
    note: str = ""  # why there is no test, or what else the measure says (first non-finite steps)

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    def figure(self, digits: int = 3) -> str:
        """The key figure: a - b with its interval."""
        if self.diff is None:
            return "no paired values"
        ci = (f" [{self.interval.low:+.{digits}g}, {self.interval.high:+.{digits}g}]" if self.interval else
              " (no interval)")
        return f"{self.diff:+.{digits}g}{ci} {self.unit}"

    def sentence(self) -> str:
        c = self.compare
        head = f"{c.label}: **{self.outcome_text()}**"
        if self.diff is None:
            return f"{head} ({self.note or 'no paired values'})."
        b = f"{self.mean_b:.4g}" if c.than is not None else f"{_describe(c.b)} {self.mean_b:.4g}"
        sides = f"{_describe(c.a)} {self.mean_a:.4g} vs {b} {self.unit}"
        ci_name = ("" if self.interval is None else
                   " (90% t interval)" if c.expect == "equal" else " (95% bootstrap interval)")
        parts = [sides, f"a - b = {self.figure()}{ci_name} over {self.n_pairs} paired "
                        f"{'key' if self.n_pairs == 1 else 'keys'} ({self.n_seeds} seed{'s' if self.n_seeds != 1 else ''})"]
        if self.p_value is not None:
            parts.append(f"{self.test} {format_p(self.p_value)}, Holm-adjusted {format_p(self.p_adjusted)}")
        if c.expect == "equal":
            parts.append(f"equivalence margin +-{c.margin:g} {self.unit}")
        if self.note:
            parts.append(self.note)
        return f"{head} ({'; '.join(p for p in parts if p)})."

    def outcome_text(self) -> str:
        if self.outcome != CANNOT_TELL:
            return self.outcome
        return cannot_tell_text(self.n_seeds, self.seeds_needed)


def cannot_tell_text(n_seeds: int, needed: int | None) -> str:
    seeds = f"{n_seeds} seed{'s' if n_seeds != 1 else ''}"
    if needed is None:
        return f"cannot tell with {seeds} (no estimate of how many would tell)"
    if needed > MAX_SEEDS:
        return f"cannot tell with {seeds} (more than {MAX_SEEDS:,} would be needed)"
    return f"cannot tell with {seeds} (about {needed} would tell)"


def _describe(selector: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (selector or {}).items())


@dataclass
class Verdict:
    claim: Claim
    results: list  # of Result, one per [[compare]]
    reported: list  # of Result, one per [[report]]
    outcome: str  # AGREES, DISAGREES or CANNOT_TELL
    n_seeds: int
    seeds_needed: int | None

    def text(self) -> str:
        return self.outcome if self.outcome != CANNOT_TELL else cannot_tell_text(self.n_seeds, self.seeds_needed)

    def as_dict(self) -> dict:
        def result(r: Result) -> dict:
            return {"label": r.compare.label, "measure": r.compare.measure, "expect": r.compare.expect,
                    "outcome": r.outcome_text(), "diff": r.diff,
                    "interval": [r.interval.low, r.interval.high] if r.interval else None, "unit": r.unit,
                    "mean_a": r.mean_a, "mean_b": r.mean_b, "p_value": r.p_value, "p_adjusted": r.p_adjusted,
                    "n_pairs": r.n_pairs, "seeds": list(r.seeds), "seeds_needed": r.seeds_needed, "note": r.note}

        return {"claim": self.claim.name, "verdict": self.text(), "outcome": self.outcome, "n_seeds": self.n_seeds,
                "seeds_needed": self.seeds_needed, "results": [result(r) for r in self.results],
                "reported": [result(r) for r in self.reported]}


# ------------------------------------------------------------------------------ the engine


def evaluate(claim: Claim, source: str | Path | Runs, metrics: pd.DataFrame | None = None) -> Verdict:
    """The claim's verdict from a grid folder (or loaded Runs, with their cell_metrics)."""
    runs = source if isinstance(source, Runs) else load_runs(source)
    ctx = Context(runs, metrics if metrics is not None else cell_metrics(runs))
    alpha_each = claim.alpha / len(claim.compare)
    results = [compare(ctx, c, claim.alpha, alpha_each) for c in claim.compare]
    reported = [compare(ctx, c, claim.alpha, claim.alpha) for c in claim.report]
    results = _correct(results, claim.alpha)
    reported = _correct(reported, claim.alpha)
    outcomes = [r.outcome for r in results]
    undecided = [r for r in results if r.outcome == CANNOT_TELL]
    if all(o == AGREES for o in outcomes):
        outcome = AGREES
    elif DISAGREES in outcomes:
        outcome = DISAGREES
    else:
        outcome = CANNOT_TELL
    n_seeds = min((r.n_seeds for r in undecided), default=max((r.n_seeds for r in results), default=0))
    needs = [r.seeds_needed for r in undecided]
    needed = None if not needs or None in needs else max(needs)
    return Verdict(claim, results, reported, outcome, n_seeds, needed)


def compare(ctx: Context, c: Compare, alpha: float, alpha_power: float) -> Result:
    """One comparison before the correction (outcome and p_adjusted are set by _correct)."""
    m: Measure = MEASURES[c.measure]
    metrics = ctx.metrics
    try:
        a_cells = metrics[select(metrics, c.selector("a"))]
        b_cells = metrics[select(metrics, c.selector("b"))] if c.b is not None else a_cells.iloc[0:0]
        key_axes = pairing_axes(ctx.runs, c, m, a_cells, b_cells)
        a = values_by_key(ctx, a_cells, key_axes, m, c.params)
        if c.b is not None:
            b = values_by_key(ctx, b_cells, key_axes, m, c.params)
        else:
            b = pd.Series({k: c.than for k in a.index}, dtype=float)
    except (MeasureUnavailable, SelectionError) as e:
        return Result(c, m.unit, "", (), 0, 0, 0, None, None, None, None, None, note=str(e))
    keys = [k for k in a.index if k in b.index]
    seeds = tuple(sorted({k[0] for k in keys}, key=str))
    va, vb = a[keys].to_numpy(dtype=float), b[keys].to_numpy(dtype=float)
    pairs_per_seed = len(keys) / len(seeds) if seeds else 1.0
    side_note = _side_note(ctx, m, a_cells, b_cells)
    base = dict(compare=c, unit=m.unit, seeds=seeds, n_pairs=len(keys), n_a=len(a), n_b=len(b) if c.b else 0,
                mean_a=float(va.mean()) if keys else None, mean_b=float(vb.mean()) if keys else None)
    if not keys:
        why = "no key has a value on both sides" if c.b is not None else "no cell has a value"
        return Result(**base, test="", diff=None, interval=None, p_value=None,
                      note="; ".join(x for x in (why, side_note) if x))
    d = va - vb
    if m.test == "binary":
        test, p, needed = _mcnemar(va, vb, alpha_power)
        interval = bootstrap_ci(d)
    elif c.expect == "equal":
        test, p, interval, needed = _tost(d, c.margin, alpha, alpha_power)
    else:
        test, p, needed = _t_test(d, c.b is None, alpha_power)
        interval = bootstrap_ci(d)
    if needed is not None:
        needed = max(2, math.ceil(needed / pairs_per_seed))
    return Result(**base, test=test, diff=float(d.mean()), interval=interval, p_value=p, seeds_needed=needed,
                  note=side_note)


def pairing_axes(runs: Runs, c: Compare, m: Measure, a_cells: pd.DataFrame, b_cells: pd.DataFrame) -> list[str]:
    """seed, then every axis that varies within a side (so its cells must pair value for value),
    but those that tell a from b or that the measure consumes. An axis constant on each side
    goes with the split (norm_type is null for norm=none, act for a gated MLP)."""
    drop = {COLUMN_OF.get(k, k) for k in c.split_keys} | set(c.split_keys) | set(m.consumes)
    within = [ax for ax in runs.varying_axes if ax not in drop and ax in a_cells
              and any(side[ax].nunique(dropna=False) > 1 for side in (a_cells, b_cells) if not side.empty)]
    return ["seed", *within]


# The tests themselves live in stats.py; these name the one a verdict used and turn its effect
# into the seeds that would tell (`needed`, at the Bonferroni-bounded alpha_power).


def _t_test(d: np.ndarray, one_sample: bool, alpha_power: float):
    """(name, p, seeds needed): the two-sided t-test of the per-key differences a - b (or
    a - `than`); no p-value and no seed count where the differences do not vary."""
    name = "one-sample t-test" if one_sample else "paired t-test"
    return name, one_sample_p_value(d), seeds_for_power(d, alpha_power, DEFAULT_POWER)


def _tost(d: np.ndarray, margin: float, alpha: float, alpha_power: float):
    """(name, decisive p, 90% interval, seeds needed): TOST when |mean| < margin, else the
    one-sided test that the difference lies beyond the margin."""
    result = tost(d, margin, alpha)
    if result is None:
        return "TOST", None, None, None
    name = "TOST" if result.within else "one-sided t-test beyond the margin"
    return name, result.p_value, result.interval, _one_sided_seeds(result.effect_size, alpha_power)


def _one_sided_seeds(effect: float, alpha: float) -> int | None:
    """one_sided_seeds_for_power, with a real effect too small to chase as MAX_SEEDS + 1 (the
    verdict says "more than MAX_SEEDS would be needed" rather than "no estimate")."""
    needed = one_sided_seeds_for_power(effect, alpha, DEFAULT_POWER)
    return MAX_SEEDS + 1 if needed is None and effect > 0 else needed


def _mcnemar(a: np.ndarray, b: np.ndarray, alpha_power: float):
    """(name, p, pairs needed): the exact McNemar test, and the pairs at which it reaches 80%
    power for the observed discordance rates."""
    n10, n01 = discordant_pairs(a, b)
    return "exact McNemar test", mcnemar_exact(a, b), mcnemar_pairs_for_power(n10 / a.size, n01 / a.size,
                                                                             alpha_power)


def _correct(results: list[Result], alpha: float) -> list[Result]:
    """Holm across the family, then each comparison's outcome."""
    from dataclasses import replace

    adjusted = adjust_p_values([r.p_value for r in results], CORRECTION)
    out = []
    for r, p in zip(results, adjusted):
        out.append(replace(r, p_adjusted=p, outcome=_outcome(r, p, alpha)))
    return out


def _outcome(r: Result, p: float | None, alpha: float) -> str:
    if r.diff is None or p is None or p >= alpha:
        return CANNOT_TELL
    c = r.compare
    if c.expect == "equal":
        return AGREES if abs(r.diff) < c.margin else DISAGREES
    right = r.diff > 0 if c.expect == "higher" else r.diff < 0
    return AGREES if right else DISAGREES


def _side_note(ctx: Context, m: Measure, a_cells: pd.DataFrame, b_cells: pd.DataFrame) -> str:
    """For divergence: when each side first went non-finite."""
    if m.name != "diverged":
        return ""
    from ablate.analysis.claim_measures import first_nonfinite_step

    parts = []
    for name, cells in (("a", a_cells), ("b", b_cells)):
        if cells.empty:
            continue
        gone = cells[cells["status"] == "diverged"]
        steps = [s for s in (first_nonfinite_step(ctx, cid) for cid in gone["cell_id"]) if s is not None]
        trained = int(cells["status"].isin(DONE).sum())
        text = f"{name}: diverged {len(gone)}/{trained}"
        if steps:
            text += f", first non-finite value at step {int(np.median(steps))} (median; {min(steps)}-{max(steps)})"
        elif len(gone):
            text += f", at step {int(pd.to_numeric(gone['diverged_at_step'], errors='coerce').median())} (median)"
        parts.append(text)
    return "; ".join(parts)
