"""A claim's verdict in words: the report section (on top of `ablate report`'s report.md), its
plots, verdict.json, and the index report that links every claim's verdict."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ablate.analysis.claim_checks import CLAUSE_LETTERS as LETTERS  # a claim has at most these clauses
from ablate.analysis.claim_measures import MEASURES
from ablate.analysis.claims import NON_INFERIORITY, Claim
from ablate.analysis.outcomes import SCORING_RULE
from ablate.analysis.safe_files import replace_atomic
from ablate.analysis.verdict import (CANNOT_TELL, CORRECTION, ClauseResult, Result, Verdict, evaluate,
                                     outcome_counts)

VERDICT_JSON = "verdict.json"


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def _sel(selector) -> str:
    return ", ".join(f"{k}={v}" for k, v in (selector or {}).items())


def _g(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}g}"


# ------------------------------------------------------------------------ one comparison


def figure(r: Result) -> str:
    """The key figure: the estimate with its interval and p-value, from one test."""
    t = r.test
    if t is None:
        return r.note or "no test"
    if t.name == "exact count":
        return f"a - b = {_g(t.estimate, 4)} {r.unit} (exact, {t.estimate / r.mean_b:+.2%} of b)" if r.mean_b else \
            f"a - b = {_g(t.estimate, 4)} {r.unit} (exact)"
    ci = f"[{t.interval.low:.3g}, {t.interval.high:.3g}]" if t.interval else "(no interval)"
    level = f"{t.interval.confidence:.0%}" if t.interval else ""
    if MEASURES[r.compare.measure].test == "binary" and t.p_value is None:
        return f"{t.detail}: no discordant pair, no test"
    if MEASURES[r.compare.measure].test == "binary":
        what = (f"share of discordant pairs where a alone {r.unit.split()[-1]}" if r.compare.b is not None
                else f"rate (against {r.compare.than:g})")
        return f"{t.detail}; {what} {t.estimate:.2f} {ci} ({level} Clopper-Pearson); {t.name} p = {_p(t.p_value)}"
    kind = f"{level} t interval" + (", its upper end the one-sided bound" if r.compare.expect in NON_INFERIORITY
                                    else "")
    return f"a - b = {_g(t.estimate)} {ci} {r.unit} ({kind}); {t.name} p = {_p(t.p_value)}"


def _excluded(r: Result) -> str:
    """What a result that cannot tell still rules out, and what would resolve it."""
    t, parts, kind = r.test, [], MEASURES[r.compare.measure].test
    if t is None:
        return r.note
    if kind == "t" and t.interval is not None and r.compare.effect and _beyond(t, r.compare):
        return (f"a - b = {_g(t.estimate)} [{t.interval.low:.3g}, {t.interval.high:.3g}] {r.unit}, p = "
                f"{_p(t.p_value)}: beyond the smallest effect of interest on its own")
    if t.interval is not None and kind == "t":
        parts.append(f"the data exclude a - b below {t.interval.low:+.3g} or above {t.interval.high:+.3g} {r.unit}")
    if kind == "binary" and t.detail:
        parts.append(f"failed {t.detail}" if r.compare.measure == "failed" else t.detail)
    if t.interval is not None and kind == "binary":
        what = (f"the share of discordant pairs where a alone {r.unit.split()[-1]}" if r.compare.b is not None
                else "a's rate")
        parts.append(f"the data exclude {what} outside [{t.interval.low:.2f}, {t.interval.high:.2f}]")
    if r.seeds_needed is not None:
        parts.append(f"about {r.seeds_needed} seeds would resolve the smallest effect of interest "
                     f"({r.compare.effect:g} {r.unit})")
    elif r.compare.effect and kind == "t":
        parts.append(f"no estimate of the seeds that would resolve {r.compare.effect:g} {r.unit} (no spread observed)")
    return "; ".join(parts)


def _beyond(t, c) -> bool:
    """Whether the interval lies wholly past the smallest effect of interest, the claimed way."""
    return t.interval.low > c.effect if c.higher else t.interval.high < -c.effect


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
    return notes


def sentence(r: Result) -> str:
    c = r.compare
    b = f"{c.than:g}" if c.than is not None else _sel(c.b)
    head = f"{c.label} (a: {_sel(c.a)}; b: {b}{'; at ' + _sel(c.at) if c.at else ''})"
    if not r.keys:
        return f"{head}: {r.note or 'no paired values'}."
    units = f"{r.n_pairs} paired unit{'s' if r.n_pairs != 1 else ''} ({len(r.seeds)} seed{'s' if len(r.seeds) != 1 else ''})"
    values = ""
    if MEASURES[c.measure].test == "t" and r.n_pairs <= 12:
        values = "per-unit a - b: " + ", ".join(f"{x - y:+.3g}" for x, y in zip(r.a, r.b))
    parts = [f"a {r.mean_a:.4g} vs b {r.mean_b:.4g} {r.unit} over {units}", figure(r), values, *_side_notes(r),
             r.note if r.test is not None else ""]
    return f"{head}: {'; '.join(p for p in parts if p)}."


# -------------------------------------------------------------------------- the section


def clause_line(i: int, c: ClauseResult) -> str:
    exact = all(r.test is not None and r.test.name == "exact count" for r in c.results)
    p = " (an exact count, no test)" if exact else \
        f" (Holm-adjusted p = {_p(c.p_adjusted)})" if c.p_adjusted is not None else ""
    line = f"({LETTERS[i]}) {c.clause.label}: **{c.outcome}**{p}"
    if c.outcome == CANNOT_TELL:
        excluded = [x for x in (_excluded(r) for r in c.results) if x]
        if excluded:
            line += f"; {'; '.join(excluded)}"
    edges = [r for r in c.results if r.edge]
    return line + ("; best lr at the edge of the sweep" if edges and "edge" not in line else "")


def verdict_section(verdict: Verdict, plots: dict | None = None) -> str:
    claim, plots = verdict.claim, plots or {}
    lines = [f"## Verdict: {claim.name}", "", f"> {claim.statement}", "",
             f"Source: {claim.source}. The source's own figures: {claim.source_figures}.", "",
             f"**Verdict: {verdict.text()}.**", ""]
    lines += [f"- {clause_line(i, c)}" for i, c in enumerate(verdict.clauses)]
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
    return (f"Method (analysis/claims.py states every rule, with its reference): units pair by seed (same seed = "
            f"same initial weights and batches) and by every other axis the two sides share; several units of one "
            f"seed are taken as independent. Each comparison's interval and p-value come from one test at alpha {claim.alpha:g}. A "
            f"clause agrees when every comparison in it points the claimed way (intersection-union: its p-value is "
            f"the largest of theirs); the {len(verdict.clauses)} clauses' p-values are "
            f"{CORRECTION.title()}-adjusted together. Failed training runs are counted: {SCORING_RULE}; a cell that "
            f"did not finish is a missing value, named above. \"Cannot tell\" gives the interval's ends and the seeds "
            f"that would resolve the clause's declared smallest effect.")


# ------------------------------------------------------------------------------- on disk


def as_dict(verdict: Verdict) -> dict:
    def result(r: Result) -> dict:
        t = r.test
        return {"label": r.compare.label, "measure": r.compare.measure, "expect": r.compare.expect,
                "figure": figure(r), "sentence": sentence(r), "test": t.name if t else None,
                "estimate": t.estimate if t else None, "interval": [t.interval.low, t.interval.high] if t and t.interval
                else None, "p_value": t.p_value if t else None, "diff": r.diff, "mean_a": r.mean_a, "mean_b": r.mean_b,
                "unit": r.unit, "n_pairs": r.n_pairs, "seeds": list(r.seeds), "seeds_needed": r.seeds_needed,
                "effect": r.compare.effect, "best_lr": {s: [[w, lr, e] for w, lr, e in p] for s, p in r.best.items()},
                "outcomes": r.outcomes, "missing": {s: len(m) for s, m in r.missing.items()}, "note": r.note}

    return {"claim": verdict.claim.name, "verdict": verdict.text(),
            "clauses": [{"label": c.clause.label, "sentence": c.clause.sentence, "outcome": c.outcome,
                         "line": clause_line(i, c), "p_value": c.p_value, "p_adjusted": c.p_adjusted,
                         "results": [result(r) for r in c.results]} for i, c in enumerate(verdict.clauses)],
            "reported": [result(r) for r in verdict.reported]}


def write_claim_report(claim: Claim, out: Path, full: bool = True, listed_only: bool = False) -> tuple[Path, Verdict]:
    """report.md (the verdict section on top of `ablate report`'s report; with full=False the
    verdict section alone), the claim's plots and verdict.json for a grid folder that ran the
    claim's grid. `listed_only`: only the cells its grid.json lists (analysis.load.load_runs)."""
    from ablate.analysis.claim_measures import Context
    from ablate.analysis.claim_plots import write_claim_plots
    from ablate.analysis.load import load_runs

    if full:
        from ablate.analysis.analyse import analyse

        analysis = analyse(load_runs(out, listed_only))
        runs, metrics = analysis.runs, analysis.metrics
    else:
        from ablate.analysis.metrics import cell_metrics

        runs = load_runs(out, listed_only)
        metrics = cell_metrics(runs)
    verdict = evaluate(claim, runs, metrics)
    plots = write_claim_plots(claim, Context(runs, metrics), out / "plots")
    section = verdict_section(verdict, plots)
    if full:
        from ablate.analysis.report import write_report

        path = write_report(out, preamble_sections=[section], analysis=analysis)
    else:
        path = out / "report.md"
        _write(path, f"# Claim: {claim.name}\n\n{section}\n")
    _write(out / VERDICT_JSON, json.dumps(as_dict(verdict), indent=2, default=str) + "\n")
    return path, verdict


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
    _write(path, "\n".join(lines))
    return path


def _write(path: Path, text: str) -> None:
    # A fresh file renamed into place: a planted link at the name is replaced, never written through.
    replace_atomic(path, lambda f: f.write(text.encode()), fsync=False)
