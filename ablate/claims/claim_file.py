"""A claim's declaration (variants/claims/NAME.toml): its statement as clauses, and what each
clause compares. The engine that turns a grid's runs into a verdict is ablate/claims/verdict.py;
the tests it uses are ablate/claims/decide.py.

    name, statement, source, source_figures, grid        what is claimed, by whom, on which grid
    plot, plot_params        the "what" plot (claim_plots.PLOTS), e.g. loss against lr
    why_plot, why_params     the "why" plot: the mechanism behind the verdict
    scale_note               what the harness cannot test of the sentences at its scale
    [[clause]]               one checkable sentence of the source:
      sentence               the sentence, as the source says it
      label                  a short name for it
      why                    how the comparison tests the sentence (the operationalisation)
      [[clause.compare]]     its primary comparison, or the few the sentence needs together
    [[report]]               a comparison shown beside the verdict, never deciding it

A comparison names a measure (claim_measures.MEASURES), the cells of side `a` and side `b`
(axis values; `at` applies to both; a list means any of its values) or a number `than` in
place of `b`, and what the sentence expects of a against b: "higher", "lower", or, for "a
matches b", non-inferiority within `margin`: "not_higher" (a - b < margin) or "not_lower".
Every clause comparison declares `effect`, its smallest effect of interest in the measure's
unit: what "cannot tell" converts into the seeds that would resolve it (for an exact count, a
fraction of b: the difference must reach it to count). `best_lr = true`
compares each side at its own best learning rate.

The rules (ablate/claims/decide.py and ablate/claims/sequential.py apply them):

  the unit    is the seed (Fisher's unit of randomisation: only the seed draws the initial weights
              and the batches; rates, warmups and the other axes are fixed design). Cells pair by
              key, the seed and every other axis that varies within a side, except the axes that
              tell a from b and those the measure aggregates over (`consumes`); then each seed's
              paired cells are averaged into ONE value per seed (a failure measure: the difference
              in the share of failed cells over the rates and warmups the comparison reads), and
              the test runs over seeds, n = seeds. Adding rates adds no units.
  one level   every test is one-sided in the claimed direction at one level, alpha = 0.025
              (stats.ONE_SIDED_ALPHA, half the usual two-sided 0.05) unless the claim sets its
              own `alpha`; the interval is the two-sided 1 - 2 alpha interval of the same test,
              each end the one-sided bound its test uses.
  the tests   every sampled measure: the exact sign test over seeds (Conover 1999, Practical
              Nonparametric Statistics, 3.4), about the median seed (a continuous measure's
              a - b, a failure measure's share of failed cells): valid however skewed the seeds'
              values, which no test of a mean is at 6-12 seeds (decide.py's docstring has the
              figures). Its smallest p at n seeds is 1/2^n, so below ceil(log2(1/alpha)) seeds
              (6 at 0.025) it cannot decide: the claim's check against its grid flags such a
              clause ("cannot decide with 3 seeds; needs at least 6"); an exact count (a
              parameter count) decides without a test.
  effect      every clause comparison declares `effect`, its smallest effect of interest in the
              measure's unit (for an exact count, a fraction of b), and the claim file says why
              that size. "Agrees" needs the effect shown beyond 0 the claimed way and says whether
              it is also shown beyond `effect`; "does not agree: no effect as large as X" when the
              interval's claimed-side end falls short of X (futility; for "a matches b", a shown
              worse by the margin or more). Both read one interval, so they never contradict.
  best rate   with `best_lr = true` each side's rate is chosen on the sweep's seeds (the lowest
              SWEEP_SEEDS = 3) by the lowest mean scored validation loss among the swept
              rates (per value of any other axis the side leaves open), and the comparison is made
              at the chosen rates on FRESH seeds only: testing on the seeds that chose the rate
              favours the arm with the flatter basin (the winner's curse). Without fresh seeds the
              comparison says so and cannot tell. A rate at either end of the sweep is flagged.
              A swept rate within noise of a chosen one, or one a chosen rate slipped against on
              the fresh seeds, is tested on the fresh seeds too, and the comparison must be shown
              at every pairing of such rates that could hold the arms' best (intersection-union;
              ablate/claims/best_rate_bounds.py).
  failed runs a plateaued or diverged cell is a failed training run (analysis/outcomes.py): loss
              measures score a completed run as min(loss, unigram entropy) and a diverged one the
              entropy, a score without a jump; failure measures count it; a cell that did not
              finish at all is a missing value, counted and named, never dropped in silence
  a clause    is an intersection-union test (Berger 1982, Technometrics 24(4), 295-300): it agrees
              when every comparison in it is shown (its p-value is the largest of theirs; testing
              each at alpha bounds the chance of a false "agrees", so no correction within); it
              does not agree when any comparison is futile, with the smallest futility p times the
              clause's comparisons (Bonferroni: any one of them can make that verdict). Of the two
              (at most one of their nulls is true) the smaller p is the clause's.
  clauses     are a family of separately reported results: their p-values of "agrees" are
              Holm-adjusted together (Holm 1979, Scand. J. Statist. 6, 65-70); in a sequential
              design the Holm levels are carried to each clause's group-sequential boundaries
              (graphical Holm, Maurer & Bretz 2013, Stat. Biopharm. Res. 5(4), 311-320). Only a
              clause shown the claimed way passes its share on; futility frees nothing (Bretz et
              al. 2009, Stat. Med. 28, 586-604). Reports ([[report]]) are shown, unadjusted,
              never deciding.
  headline    the whole statement is a conjunction: it agrees when every clause is shown at the
              full level, with no correction (intersection-union again). The headline counts every
              outcome: "agrees (n of n)", "agrees in part (k agree, m do not, r cannot tell)",
              "does not agree (m of n, r cannot tell)", "cannot tell (n of n)".
  sequential  `ablate reproduce --decide` adds seeds in looks (spending.LOOKS: 3, 6, 12)
              only for undecided clauses, at the grid's own seeds and then the next integers;
              each look's nominal level comes from the Lan-DeMets O'Brien-Fleming
              alpha-spending function (Lan & DeMets 1983, Biometrika 70(3), 659-663) with
              boundaries by numerical integration (sequential.py); futility stops are read
              on the same repeated confidence bounds (Jennison & Turnbull 1989, JRSS B 51(3),
              305-361), non-binding. So the error rate holds however many looks are taken.
  cannot tell says what the data exclude (the interval's ends) and about how many seeds would
              resolve the declared smallest effect (not the observed one): for a continuous
              measure, the sign test's one-sided power 0.8 for a median shift of the effect at
              alpha / (number of clauses), Holm's first step, from the spread of a - b
              pooled across the comparison's design points (each rate's differences over seeds:
              many more degrees of freedom than three seeds' means, and an upper bound on their
              spread), and again at that spread's one-sided 80% upper confidence bound (chi-square
              on its degrees of freedom), as a few degrees of freedom can read a spread well under
              the truth; for a failure share, the fewest seeds at which it can decide at Holm's first
              step (the load-time note gives it at the full level too); none for an exact count.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.claims.claim_checks import ClaimError, check_claim, check_data, design_notes
from ablate.claims.claim_measures import MEASURES
from ablate.claims.decide import sign_test_min_seeds
from ablate.claims.selection import SelectionError, select
from ablate.core.bounded_read import UnreadableFile, read_toml

EXPECTATIONS = ("higher", "lower", "not_higher", "not_lower")
NON_INFERIORITY = ("not_higher", "not_lower")
CLAIM_KEYS = {"name", "statement", "source", "source_figures", "grid", "plot", "plot_params", "why_plot",
              "why_params", "scale_note", "clause", "report", "alpha"}
CLAUSE_KEYS = {"sentence", "label", "why", "compare"}
COMPARE_KEYS = {"label", "measure", "params", "at", "a", "b", "than", "expect", "margin", "effect", "best_lr"}
MIN_BEST_LR_RATES = 3  # an arm's best rate is bracketed only by a sweep of at least this many
SWEEP_SEEDS = 3  # a best-rate comparison chooses each arm's rate on the lowest this many seeds


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
    effect: float | None = None  # the smallest effect of interest, in the measure's unit
    best_lr: bool = False

    def selector(self, side: str) -> dict:
        return {**self.at, **(self.a if side == "a" else self.b or {})}

    @property
    def split_keys(self) -> set:
        """The axes that tell a from b (not part of the pairing key)."""
        return set(self.a) | set(self.b or {})

    @property
    def higher(self) -> bool:
        """Whether the sentence expects a above b (for non-inferiority: a is not below by the margin)."""
        return self.expect in ("higher", "not_lower")


@dataclass(frozen=True)
class Clause:
    sentence: str
    label: str
    compare: tuple  # of Compare, decided together (intersection-union)
    why: str = ""


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    source: str
    source_figures: str
    grid: str  # a shipped grid name or a TOML path
    clauses: tuple  # of Clause
    report: tuple = ()  # of Compare: shown beside the verdict, not part of it
    plot: str | None = None  # a plot kind of claim_plots.PLOTS: what the claim says, at a glance
    plot_params: dict = field(default_factory=dict)
    why_plot: str | None = None  # the plot kind that shows the mechanism behind the verdict
    why_params: dict = field(default_factory=dict)
    scale_note: str = ""
    alpha: float = ONE_SIDED_ALPHA
    path: str | None = None

    @property
    def compare(self) -> tuple:
        """Every comparison the verdict is made of, clause by clause."""
        return tuple(c for clause in self.clauses for c in clause.compare)

    @property
    def first_step_level(self) -> float:
        """Holm's first step: alpha shared equally by the clauses, the level a clause is shown at
        while every other is still open (what "about N seeds" and the seed floors are sized for)."""
        return self.alpha / len(self.clauses)


def load_claim(path: str | Path) -> Claim:
    path = Path(path)
    try:  # bounded: a FIFO, a device, a huge or deeply nested file is refused in one line
        data = read_toml(path)
    except UnreadableFile as e:
        raise ClaimError(f"{path}: unreadable claim ({e.why})") from None
    except OSError as e:
        raise ClaimError(f"{path}: unreadable claim ({' '.join(str(e).split())})") from None

    check_data(data, str(path))  # all of it, before any cell trains
    claim = parse_claim(data, str(path))
    check_claim(claim, str(path))
    return claim


def _fail(where: str, message: str):
    raise ClaimError(f"{where}: {message}")


def _unknown(entry: dict, valid: set, where: str) -> None:
    unknown = set(entry) - valid
    if unknown:
        _fail(where, f"unknown key {sorted(unknown)[0]!r}; valid: {', '.join(sorted(valid))}")


def _tables(data: dict, key: str, where: str) -> list:
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
        _fail(where, f"[[{key}]] must be a list of tables")
    return items


def parse_claim(data: dict[str, Any], where: str = "claim") -> Claim:
    _unknown(data, CLAIM_KEYS, where)
    for key in ("name", "statement", "source", "grid"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            _fail(where, f"{key!r} must be a non-empty string")
    from ablate.claims.claim_plots import PLOTS  # lazy: matplotlib, seaborn only when used

    for key in ("plot", "why_plot"):
        if data.get(key) is not None and data[key] not in PLOTS:
            _fail(where, f"{key} {data[key]!r} is not a plot kind; valid: {', '.join(PLOTS)}")
    clauses = tuple(_parse_clause(e, f"{where}: [[clause]][{i}]") for i, e in enumerate(_tables(data, "clause", where)))
    if not clauses:
        _fail(where, "a claim needs at least one [[clause]]")
    report = tuple(_parse_compare(e, f"{where}: [[report]][{i}]", deciding=False)
                   for i, e in enumerate(_tables(data, "report", where)))
    alpha = data.get("alpha", ONE_SIDED_ALPHA)
    if not isinstance(alpha, float) or not 0 < alpha < 0.5:
        _fail(where, f"alpha {alpha!r} must be a one-sided level between 0 and 0.5")
    return Claim(data["name"], data["statement"], data["source"], str(data.get("source_figures", "none given")),
                 data["grid"], clauses, report, data.get("plot"), dict(data.get("plot_params", {})),
                 data.get("why_plot"), dict(data.get("why_params", {})), str(data.get("scale_note", "")), alpha,
                 where if where.endswith(".toml") else None)


def _parse_clause(entry: dict, where: str) -> Clause:
    _unknown(entry, CLAUSE_KEYS, where)
    for key in ("sentence", "label"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            _fail(where, f"{key!r} must be a non-empty string")
    compares = tuple(_parse_compare(e, f"{where}.compare[{i}]", deciding=True)
                     for i, e in enumerate(_tables(entry, "compare", where)))
    if not compares:
        _fail(where, "a clause needs at least one [[clause.compare]]")
    return Clause(entry["sentence"], entry["label"], compares, str(entry.get("why", "")))


def _number(entry: dict, key: str, where: str, positive: bool = True) -> float | None:
    if key not in entry:
        return None
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        _fail(where, f"{key!r} must be a {'positive ' if positive else ''}number, not {value!r}")
    return float(value)


def _parse_compare(entry: dict, where: str, deciding: bool) -> Compare:
    _unknown(entry, COMPARE_KEYS, where)
    if entry.get("measure") not in MEASURES:
        _fail(where, f"measure {entry.get('measure')!r} is not registered; valid: {', '.join(MEASURES)}")
    m = MEASURES[entry["measure"]]
    if entry.get("expect") not in EXPECTATIONS:
        _fail(where, f"expect {entry.get('expect')!r}; valid: {', '.join(EXPECTATIONS)}")
    for key in ("a", "b", "at", "params"):
        if key in entry and not isinstance(entry[key], dict):
            _fail(where, f"{key!r} must be a table of axis = value")
    if not entry.get("a"):
        _fail(where, "'a' must select some cells (axis = value)")
    if ("b" in entry) == ("than" in entry):
        _fail(where, "give exactly one of 'b' (cells) or 'than' (a number)")
    than, margin, effect = (_number(entry, "than", where, positive=False), _number(entry, "margin", where),
                            _number(entry, "effect", where))
    if entry["expect"] in NON_INFERIORITY and (margin is None or m.test != "t" or than is not None):
        _fail(where, f"expect = {entry['expect']!r} needs a positive 'margin', cells 'b' and a continuous measure")
    if m.test == "exact" and than is not None:
        _fail(where, "an exact measure compares cells 'b', not a number")
    if deciding and effect is None and margin is None:
        _fail(where, "a clause's comparison needs 'effect', its smallest effect of interest in "
                     f"{m.unit} (what 'cannot tell' turns into seeds)")
    best_lr = entry.get("best_lr", False)
    if not isinstance(best_lr, bool) or (best_lr and ("lr" in m.consumes or "lr" in entry.get("at", {}))):
        _fail(where, "best_lr must be true or false, for a measure that does not consume lr and an 'at' that "
                     "leaves lr open")
    return Compare(str(entry.get("label") or entry["measure"]), entry["measure"], dict(entry["a"]),
                   dict(entry["b"]) if "b" in entry else None, than, entry["expect"], dict(entry.get("at", {})),
                   dict(entry.get("params", {})), margin, effect if effect is not None else margin, best_lr)


# -------------------------------------------------------------------- against its grid


def check_against_grid(claim: Claim, cells: pd.DataFrame) -> list[str]:
    """Refuse (ClaimError) a comparison its grid cannot feed: a side that selects no cell, a
    measure that needs more values of an axis than the side has (it could not vary), a best
    rate chosen from fewer than MIN_BEST_LR_RATES rates. `cells`: one row per grid cell, with the
    axis columns a selector names. Returns the clauses the grid's seeds cannot decide
    (seed_floor_notes), which the caller shows: a fixed design may still run them."""
    where = claim.path or claim.name
    for label, c in [(f"clause {clause.label!r}", c) for clause in claim.clauses for c in clause.compare] + \
                    [("report", c) for c in claim.report]:
        here = f"{where}: {label}, {c.label!r}"
        for side in ("a", "b") if c.b is not None else ("a",):
            try:
                mine = cells[select(cells, c.selector(side))]
            except SelectionError as e:
                _fail(here, str(e))
            if mine.empty:
                _fail(here, f"side {side} selects no cell of grid {claim.grid!r}")
            needs = dict(MEASURES[c.measure].requires)
            if c.best_lr:
                needs["lr"] = max(needs.get("lr", 0), MIN_BEST_LR_RATES)
            for axis, least in needs.items():
                have = mine[axis].nunique() if axis in mine else 1
                if have < least:
                    _fail(here, f"measure {c.measure!r} cannot vary on this grid: side {side} has {have} value(s) of "
                                f"{axis}, it needs at least {least}")

    return seed_floor_notes(claim, cells) + design_notes(claim, cells)


def seed_floor_notes(claim: Claim, cells: pd.DataFrame) -> list[str]:
    """"clause (a) ...: cannot decide with 3 seeds; needs at least 6", for each clause whose test
    cannot reach the claim's level at the seeds its grid gives it (the fresh seeds, for a best
    rate): every sampled kind is read by the sign test, whose smallest p at n seeds is 1/2^n."""
    seeds = sorted(set(cells["seed"].tolist())) if "seed" in cells else []
    notes = []
    for i, clause in enumerate(claim.clauses):
        for c in clause.compare:
            kind = MEASURES[c.measure].test
            if kind == "exact":
                continue
            have = max(0, len(seeds) - SWEEP_SEEDS) if c.best_lr else len(seeds)
            need = sign_test_min_seeds(claim.alpha)  # every sampled kind is read by the sign test
            if have < need:
                fresh = " fresh" if c.best_lr else ""
                first = sign_test_min_seeds(claim.first_step_level)
                holm = (f" ({first} at Holm's first step, one-sided {claim.alpha:g} / {len(claim.clauses)} clauses)"
                        if first != need else "")
                notes.append(f"clause ({'abcdefghijklmnopqrstuvwxyz'[i]}) {clause.label!r}: cannot decide with {have}"
                             f"{fresh} seed{'s' if have != 1 else ''}; needs at least {need}{holm}")
                break
    return notes


def claim_at_rung(claim: Claim, rates: dict[float, float], ref_width: int | None = None,
                  width: int | None = None) -> Claim:
    """The claim as a ladder's rung runs it (ablate/ladder/rungs.py): every `lr` its comparisons select
    mapped as `rates` says, and, where a selector names widths, the claim's own width
    (`ref_width`) replaced by the rung's `width`: every cell of a rung has the rung's width, so a
    report that names only other widths (mlp-ratio's equal-parameter cells) is left out of the
    rung; a clause must name the claim's own width."""
    def lr_of(d: dict | None) -> dict | None:
        if d is None or "lr" not in d:
            return d
        v = d["lr"]
        return {**d, "lr": [rates.get(float(x), x) for x in v] if isinstance(v, list) else rates.get(float(v), v)}

    def width_of(d: dict | None) -> dict | None | bool:  # False: names no width the rung has
        if d is None or "width" not in d or width is None:
            return d
        named = d["width"] if isinstance(d["width"], list) else [d["width"]]
        return {**d, "width": width} if any(int(w) == ref_width for w in named) else False

    def cmp(c):
        a, b, at = (width_of(lr_of(d)) for d in (c.a, c.b, c.at))
        return None if False in (a, b, at) else replace(c, a=a, b=b, at=at)

    clauses = []
    for cl in claim.clauses:
        mapped = tuple(cmp(c) for c in cl.compare)
        if None in mapped:
            raise ClaimError(f"{claim.path or claim.name}: clause {cl.label!r} names no width {ref_width}, the claim's "
                             f"own: a ladder rung (width {width}) cannot run it")
        clauses.append(replace(cl, compare=mapped))
    return replace(claim, clauses=tuple(clauses), report=tuple(r for r in map(cmp, claim.report) if r is not None))
