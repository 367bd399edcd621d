"""A claim's verdict in words: the report section (on top of `ablate report`'s report.md), its
plots, verdict.json, and the index report that links every claim's verdict."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ablate.analysis.analyse import analyse
from ablate.analysis.load import load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.analysis.outcomes import SCORING_RULE
from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.claims.claim_checks import CLAUSE_LETTERS as LETTERS  # a claim has at most these clauses
from ablate.claims.claim_file import Claim
from ablate.claims.claim_measures import Context
from ablate.claims.decide import ESTIMANDS, SPREAD_UPPER_LEVEL, z_of
from ablate.claims.best_rate_bounds import rivals_text
from ablate.claims.rate_choice import NEAR_BEST, SLIPPED, near_text, slipped_text
from ablate.claims.spending import LOOKS, fixed_after_decide
from ablate.claims.verdict import (CANNOT_TELL, CORRECTION, DISAGREES, ClauseResult, Result, Verdict, conjunction,
                                   evaluate, headline_status, outcome_counts)
from ablate.core.safe_files import write_text_atomic

VERDICT_JSON = "verdict.json"


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def _sel(selector) -> str:
    return ", ".join(f"{k}={v}" for k, v in (selector or {}).items())


def _g(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}g}"


# ------------------------------------------------------------------------ one comparison


def level_text(confidence: float) -> str:
    """95%, 99.38%, 99.9987%: four digits, more only where fewer would read as 100%."""
    for digits in range(4, 10):
        text = f"{100 * confidence:.{digits}g}"
        if float(text) < 100 or confidence >= 1:
            return f"{text}%"
    return f"{100 * confidence}%"


def figure(r: Result) -> str:
    """The key figure: the seeds' estimate with its interval and p-values, from one test."""
    t = r.test
    if t is None:
        return r.note or "no test"
    if t.name == "exact count":
        return f"a - b = {_g(t.estimate, 4)} {r.unit} (exact, {t.estimate / r.mean_b:+.2%} of b)" if r.mean_b else \
            f"a - b = {_g(t.estimate, 4)} {r.unit} (exact)"
    ci = f"[{t.interval.low:.3g}, {t.interval.high:.3g}]" if t.interval else "(no interval)"
    level = level_text(t.interval.confidence) if t.interval else ""
    ps = f"p = {_p(t.p_value)}" + (f", beyond the effect p = {_p(t.p_beyond)}" if t.p_beyond is not None else "") + \
        (f", short of it p = {_p(t.p_futile)}" if t.p_futile is not None else "")
    if t.name.startswith("exact sign"):
        what = ("a - b" if r.kind != "binary" else "share failed, a - b" if r.compare.b is not None
                else f"share failed - {r.compare.than:g}")
        return (f"{t.detail}; per-seed {what}: median {t.estimate:+.3g} {ci} ({level} sign-test interval); "
                f"{t.name} (one-sided), {ps}")
    kind = f"{level} t interval, each end a one-sided bound"
    return f"a - b = {_g(t.estimate)} {ci} {r.unit} over {t.n} seeds ({kind}); {t.name}, {ps}"


def waiting(results, level: float) -> list[str]:
    """The labels of a clause's comparisons not shown at `level` while another one is: the clause
    (every comparison must be shown) waits for them."""
    shown = [r.test is not None and r.test.shown(level) for r in results]
    return [r.compare.label for r, ok in zip(results, shown) if not ok] if any(shown) and not all(shown) else []


def _excluded(r: Result, waits: list | None = None) -> str:
    """What a result that cannot tell still rules out, and what would resolve it (for a
    comparison already shown, that its clause waits for its other comparisons)."""
    t, parts = r.test, []
    if t is None:
        return r.note
    if t.interval is not None and t.name != "exact count":
        what = "the seeds' median of a - b" if t.name.startswith("exact sign") else "a - b"
        ends = [f"{side} {end:+.3g}" for side, end in (("below", t.interval.low), ("above", t.interval.high))
                if math.isfinite(end)]
        parts.append(f"the data exclude {what} {' or '.join(ends)} {r.unit}" if ends else
                     f"{t.n} seeds exclude no value of {what} yet (its interval is unbounded)")
    if t.detail:
        parts.append(t.detail)
    if waits and r.compare.label not in waits:
        parts.append("shown the claimed way; the clause waits for its other comparison"
                     + ("s" if len(waits) > 1 else "") + ": " + "; ".join(waits))
    elif r.seeds_needed is not None and r.kind == "binary":
        parts.append(f"a sign test needs at least {r.seeds_needed} seeds, every one the claimed way, at Holm's "
                     "first step (fewer once the other clauses are decided)")
    elif r.seeds_needed is not None:
        upper = (f", {r.seeds_needed_upper} at its {SPREAD_UPPER_LEVEL:.0%} upper confidence bound"
                 if r.seeds_needed_upper not in (None, r.seeds_needed) else "")
        parts.append(f"about {r.seeds_needed} seeds would resolve the smallest effect of interest "
                     f"({r.compare.effect:g} {r.unit}; the sign test one-sided at Holm's first step, seeds spread as "
                     f"the spread pooled over {r.spread[1]} degrees of freedom{upper})")
    elif r.compare.effect and r.kind == "t":
        parts.append(f"no estimate of the seeds that would resolve {r.compare.effect:g} {r.unit} (no spread observed)")
    return "; ".join(parts)


def _side_notes(r: Result) -> list[str]:
    notes = []
    for side in ("a", "b"):
        if r.best.get(side):
            picks = "; ".join(f"{what + ': ' if what else ''}lr {lr:g}{' (at the edge of the sweep)' if edge else ''}"
                              for what, lr, edge in r.best[side])
            notes.append(f"best lr of {side}: {picks}")
    counts = [f"{side}: {outcome_counts(r.outcomes[side])}" for side in ("a", "b") if r.outcomes.get(side)]
    if counts:
        notes.append("cells " + "; ".join(counts))
    for side, missing in r.missing.items():
        if missing:
            named = "; ".join(f"{key[0] if len(key) == 1 else key}: {why}" for key, why in list(missing.items())[:4])
            notes.append(f"{len(missing)} unit(s) of {side} have no value and are counted missing ({named})")
    if r.edge:
        notes.append("**best lr at the edge of the sweep**")
    notes += [near_text(side, r.near[side]) for side in ("a", "b") if r.near.get(side)]
    notes += [slipped_text(side, r.slips[side]) for side in ("a", "b") if r.slips.get(side)]
    if r.rivals:
        notes.append(rivals_text(r.rivals))
    return notes


def sentence(r: Result) -> str:
    c = r.compare
    b = f"{c.than:g}" if c.than is not None else _sel(c.b)
    head = f"{c.label} (a: {_sel(c.a)}; b: {b}{'; at ' + _sel(c.at) if c.at else ''})"
    if not r.keys:
        return f"{head}: {r.note or 'no paired values'}."
    units = (f"unit: the seed, n = {r.n_seeds} seed{'s' if r.n_seeds != 1 else ''} ({r.n_pairs} paired "
             f"cell{'s' if r.n_pairs != 1 else ''})")
    values = ""
    if r.kind != "exact" and r.n_seeds <= 24:
        values = "per-seed a - b: " + ", ".join(f"{x:+.3g}" for x in r.seed_values)
    if r.sweep_seeds:
        values += f"; rates chosen on seeds {', '.join(map(str, r.sweep_seeds))}, tested on the others"
    parts = [f"a {r.mean_a:.4g} vs b {r.mean_b:.4g} {r.unit} over {units}", figure(r), values, *_side_notes(r),
             r.note if r.test is not None else ""]
    return f"{head}: {'; '.join(p for p in parts if p)}."


# -------------------------------------------------------------------------- the section


def clause_line(i: int, c: ClauseResult) -> str:
    exact = all(r.test is not None and r.test.name == "exact count" for r in c.results)
    p = " (an exact count, no test)" if exact else \
        f" (Holm-adjusted p = {_p(c.p_adjusted)})" if c.p_adjusted is not None else ""
    line = f"({LETTERS[i]}) {c.clause.label}: **{c.outcome}**{p}" + (f": {c.why}" if c.why and c.decided else "")
    if c.outcome == CANNOT_TELL:
        waits = waiting(c.results, c.level or ONE_SIDED_ALPHA)
        excluded = [x for x in (_excluded(r, waits) for r in c.results) if x]
        if excluded:
            line += f"; {'; '.join(excluded)}"
    edges = [r for r in c.results if r.edge]
    line += "; best lr at the edge of the sweep" if edges and "edge" not in line else ""
    return line + rate_caveat(c.results)


def verdict_section(verdict: Verdict, plots: dict | None = None) -> str:
    claim, plots = verdict.claim, plots or {}
    lines = [f"## Verdict: {claim.name}", "", f"> {claim.statement}", "",
             f"Source: {claim.source}. The source's own figures: {claim.source_figures}.", "",
             f"**Verdict: {verdict.text()}.**", ""]
    lines += [f"- {clause_line(i, c)}" for i, c in enumerate(verdict.clauses)]
    lines += [f"\n**Note: {note}**" for note in verdict.notes]
    for kind, caption in (("what", "what the claim says, at a glance"), ("why", "why: the mechanism")):
        pngs = [p for p in plots.get(kind, []) if Path(p).suffix == ".png"]
        if pngs:
            lines += ["", f"![{claim.name}: {caption}](plots/{Path(pngs[0]).name})"]
    for i, c in enumerate(verdict.clauses):
        lines += ["", f"### ({LETTERS[i]}) {c.clause.label}", "", f"The source: \"{c.clause.sentence}\"", ""]
        if c.clause.why:
            lines += [f"How it is tested: {c.clause.why}", ""]
        lines += [f"- {sentence(r)}" for r in c.results]
    if verdict.reported:
        lines += ["", "### Shown beside the verdict, not deciding it", "",
                  *[f"- {sentence(r)}" for r in verdict.reported]]
    if claim.scale_note:
        lines += ["", f"At this scale: {claim.scale_note}"]
    lines += ["", method_note(verdict)]
    return "\n".join(lines)


def method_note(verdict: Verdict) -> str:
    claim = verdict.claim
    return (f"Method (ablate/claims/claim_file.py states every rule, with its reference): the unit is the seed (same seed = "
            f"same initial weights and batches; rates and warmups are design): each seed's paired cells are averaged "
            f"into one value and every test runs over seeds, one-sided at {claim.alpha:g}, its interval and p-values "
            f"from the same test: the exact sign test, about the median seed (a continuous measure's a - b, a "
            f"failure measure's share of failed cells), valid however skewed the seeds' values. A clause agrees when "
            f"every comparison in it is shown beyond 0 the claimed way (intersection-union), and does not agree when "
            f"its interval excludes the declared smallest effect of interest (no effect as large as the claim needs; "
            f"\"agrees in direction, smaller than claimed\" when it is also shown beyond 0); the "
            f"{len(verdict.clauses)} clauses' p-values of \"agrees\" are {CORRECTION.title()}-adjusted together (a "
            f"clause found short of its effect passes no share of alpha on), and the headline, a conjunction, agrees "
            f"when every clause is shown. Failed training runs are counted: {SCORING_RULE}; a cell that did not finish is a missing "
            f"value, named above. Best rates are chosen on the sweep's seeds and tested on fresh ones. \"Cannot "
            f"tell\" gives the interval's ends and about how many seeds would resolve the declared smallest effect.")


# ------------------------------------------------------------------------------- on disk


SCHEMA = 2  # verdict.json's layout, docs/run-directory.md. A file with no "schema" was written by an older
# ablate (version 1): a fixed design's had "verdict" and clauses' "outcome", a --decide's "headline" and "status".
FIXED, SEQUENTIAL = "fixed", "sequential"  # verdict.json's "design": one look at the seeds, or --decide's looks


def verdict_json(claim: Claim, design: str, headline_text: str, whole: bool, clauses: list, *,
                 done: bool = True, looks: tuple = (), continues: tuple | None = None, reported=(),
                 notes=(), stopped: str | None = None) -> dict:
    """verdict.json for a fixed design (as_dict) and a --decide (sequential.Decision.to_json):
    one layout, `clauses` built by clause_json. JSON has no infinity or NaN: such a number is null."""
    return _plain({"schema": SCHEMA, "claim": claim.name, "design": design, "headline": headline_text,
                   "status": headline_status(headline_text), "conjunction": whole, "done": done,
                   "stopped": stopped, "unit": "seed", "alpha": claim.alpha, "looks": list(looks),
                   "continues": [list(continues[0]), continues[1]] if continues else None, "clauses": clauses,
                   "reported": [comparison_json(r) for r in reported], "notes": list(notes)})


def clause_json(letter: str, clause, status: str, why: str, line: str, level: float | None, comparisons, *,
                p_agree=None, p_futile=None, p_adjusted=None, smaller: bool = False, seeds_used: int = 0,
                waits_for=(), looks=(), next_seeds=(), needs=()) -> dict:
    """One clause of verdict.json, whichever design decided it (docs/run-directory.md)."""
    return {"letter": letter, "label": clause.label, "sentence": clause.sentence, "status": status,
            "decided": status != CANNOT_TELL, "why": why, "line": line, "level": level, "p_agree": p_agree,
            "p_futile": p_futile, "p_adjusted": p_adjusted, "smaller_than_claimed": smaller,
            "estimand": estimand_of(comparisons),
            "seeds_used": seeds_used, "waits_for": list(waits_for), "near_best": any(r.near or r.slips for r in comparisons),
            "rates": best_rates(comparisons), "next_seeds": list(next_seeds or []), "needs": list(needs),
            "looks": [look_json(lk) for lk in looks], "comparisons": [comparison_json(r) for r in comparisons]}


def look_json(lk) -> dict:
    """One look of a --decide (analysis.sequential.Look)."""
    return {"seeds": lk.n_seeds, "seed_ids": list(lk.seeds), "statistic": lk.statistic,
            "futility_statistic": lk.futility_statistic, "boundary": lk.boundary, "nominal_level": lk.nominal_level,
            "estimate": lk.estimate, "p_value": lk.p_value, "p_futile": lk.p_futile, "outcome": lk.outcome,
            "shown": lk.shown}


def comparison_json(r: Result) -> dict:
    """One comparison: what it paired, each seed's value of a - b, and its test."""
    c = r.compare
    return {"label": c.label, "measure": c.measure, "expect": c.expect, "effect": c.effect, "unit": r.unit,
            "figure": figure(r), "sentence": sentence(r), "mean_a": r.mean_a, "mean_b": r.mean_b, "diff": r.diff,
            "n_pairs": r.n_pairs, "n_seeds": r.n_seeds, "test_unit": "seed", "seeds": list(r.seeds),
            "per_seed": list(r.seed_values), "sweep_seeds": list(r.sweep_seeds), "test": stat_test_json(r),
            "seeds_needed": r.seeds_needed, "seeds_needed_upper": r.seeds_needed_upper,
            "best_lr": {s: [[w, lr, e] for w, lr, e in p] for s, p in r.best.items()}, "outcomes": r.outcomes,
            "other_pairings": [[list(x) for x in v.rates] for v in r.rivals],
            "missing": {s: len(m) for s, m in r.missing.items()}, "note": r.note,
            "near_rates": {s: [list(x) for x in v] for s, v in r.near.items()},
            "slipped_rates": {s: [list(x) for x in v] for s, v in r.slips.items()}}


def stat_test_json(r: Result) -> dict | None:
    """A comparison's test: its estimand, estimate, z statistic, p-values and interval, from one test."""
    t = r.test
    if t is None:
        return None
    interval = None if t.interval is None else {"low": t.interval.low, "high": t.interval.high,
                                                 "confidence": t.interval.confidence}
    return {"name": t.name, "estimand": ESTIMANDS[r.kind], "estimate": t.estimate, "statistic": z_of(t.p_value),
            "p_value": t.p_value, "p_beyond": t.p_beyond, "p_futile": t.p_futile, "interval": interval,
            "level": t.level, "n": t.n, "detail": t.detail}


def rate_caveat(results) -> str:
    """The clause line's note on its best rates: a chosen rate that did not hold on the fresh
    seeds, else one within noise of another swept rate (rate_choice), else nothing."""
    if any(r.slips for r in results):
        return f"; {SLIPPED}"
    return f"; {NEAR_BEST}" if any(r.near for r in results) else ""


def estimand_of(results) -> str:
    """What a clause's tests are about (decide.ESTIMANDS), each kind once."""
    return "; ".join(dict.fromkeys(ESTIMANDS[r.kind] for r in results))


def best_rates(results) -> dict:
    """Side -> the learning rate(s) its best-rate comparisons chose (one number where one)."""
    out: dict = {}
    for r in results:
        for side, picks in r.best.items():
            out.setdefault(side, sorted({lr for _, lr, _ in picks}))
    return {side: (v[0] if len(v) == 1 else v) for side, v in out.items()}


def _plain(x):
    """Lists for tuples, Python numbers for numpy's, null for a non-finite number (an unbounded
    interval, an exact count's boundary)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if getattr(x, "ndim", None) == 0 and hasattr(x, "item"):
        x = x.item()  # a numpy scalar
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def as_dict(verdict: Verdict) -> dict:
    """A fixed design's verdict.json: one look at the seeds it has, Holm across clauses."""
    clauses = [clause_json(LETTERS[i], c.clause, c.outcome, c.why, clause_line(i, c), c.level, c.results,
                           p_agree=c.p_agree, p_futile=c.p_futile, p_adjusted=c.p_adjusted,
                           smaller=c.outcome == DISAGREES and c.shown,
                           seeds_used=min((r.n_seeds for r in c.results), default=0),
                           waits_for=waiting(c.results, c.level or ONE_SIDED_ALPHA) if c.outcome == CANNOT_TELL else ())
               for i, c in enumerate(verdict.clauses)]
    return verdict_json(verdict.claim, FIXED, verdict.text(), conjunction(verdict.clauses, verdict.claim.alpha),
                        clauses, reported=verdict.reported, notes=verdict.notes)


def write_claim_report(claim: Claim, out: Path, full: bool = True, cells: Path | None = None,
                       seeds=None, listed_only: bool = False, decided_before: bool | tuple = False) -> tuple[Path, Verdict]:
    """report.md (the verdict section on top of `ablate report`'s report; with full=False the
    verdict section alone), the claim's plots and verdict.json for a grid folder that ran the
    claim's grid. `cells`: the grid folder, when the report goes to another folder `out`;
    `seeds`: the seeds whose cells the verdict reads (a design's; default every cell's);
    `listed_only`: only the cells its grid.json lists (analysis.load.load_runs);
    `decided_before`: a `--decide` has judged this folder's seeds (the verdict says what a
    further fixed test of them does to the error rate)."""
    from ablate.claims.claim_plots import write_claim_plots  # lazy: matplotlib, seaborn only when used

    runs = load_runs(cells or out, seeds, listed_only)
    if full:
        analysis = analyse(runs)
        metrics = analysis.metrics
    else:
        metrics = cell_metrics(runs)
    verdict = evaluate(claim, runs, metrics)
    if decided_before:
        n_seeds = len(set(runs.cells["seed"])) if "seed" in runs.cells else 0
        plan = decided_before if isinstance(decided_before, tuple) else None  # the --decide's own looks
        verdict.notes.append(after_decide_note(claim, n_seeds, plan))
    plots = write_claim_plots(claim, Context(runs, metrics), out / "plots")
    section = verdict_section(verdict, plots)
    if full:
        from ablate.analysis.report import write_report  # lazy: matplotlib, seaborn only when used

        path = write_report(out, preamble_sections=[section], analysis=analysis)
    else:
        path = out / "report.md"
        write_text_atomic(path, f"# Claim: {claim.name}\n\n{section}\n")
    write_text_atomic(out / VERDICT_JSON, json.dumps(as_dict(verdict), indent=2, default=str) + "\n")
    return path, verdict


def after_decide_note(claim: Claim, n_seeds: int, looks: tuple | None = None) -> str:
    """One line: what a fixed design over seeds a `--decide` has judged does to the error rate;
    `looks`: that --decide's plan (default LOOKS: a plan 1,2,4 was said to end at 12)."""
    plan = tuple(looks or LOOKS)
    error = fixed_after_decide(n_seeds, claim.alpha, plan)
    if error <= claim.alpha:
        return (f"a --decide has judged this folder; {n_seeds} seeds add none beyond its last look ({plan[-1]}), "
                f"so this verdict adds nothing to its error rate")
    return (f"a --decide has judged this folder's first {plan[-1]} seeds: this fixed test over {n_seeds} of them is "
            f"not at one-sided {claim.alpha:g}; a false \"agrees\" comes up to {error:.3f} of the time (one null clause); "
            f"`--decide` over a planned continuation keeps the level")


def write_index(entries: list[tuple[Claim, Path, Verdict | None]], path: Path) -> Path:
    """One section per claim: its verdict, a line per clause, its plots, a link to its report."""
    lines = ["# Claims: verdicts", "",
             "Each claim's report has the full figures (its verdict section is at the top).", ""]
    for claim, out, verdict in entries:
        link = Path(os.path.relpath((out / "report.md").resolve(), path.parent.resolve())).as_posix()
        lines += [f"## {claim.name}: {verdict.text() if verdict else 'not run'}", "", f"> {claim.statement}", "",
                  f"Source: {claim.source}. [Report]({link})", ""]
        if verdict is not None:
            lines += [f"- {clause_line(i, c)}" for i, c in enumerate(verdict.clauses)]
            plots = Path(os.path.relpath((out / "plots").resolve(), path.parent.resolve())).as_posix()
            for suffix, caption in (("", "what"), ("_why", "why")):
                if (out / "plots" / f"claim_{claim.name}{suffix}.png").exists():
                    lines += ["", f"![{claim.name}: {caption}]({plots}/claim_{claim.name}{suffix}.png)"]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "\n".join(lines))
    return path
