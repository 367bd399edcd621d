"""A claim's verdict as a report section (on top of `ablate report`'s report.md), its plot,
verdict.json, and the index report that links every claim's verdict."""
from __future__ import annotations

import json
from pathlib import Path

from ablate.analysis.claims import CORRECTION, Claim, Result, Verdict, evaluate

VERDICT_JSON = "verdict.json"


def _row(r: Result) -> str:
    c = r.compare
    b = f"{c.than:g}" if c.than is not None else _sel(c.b)
    p = "—" if r.p_value is None else f"{r.p_value:.2g}"
    q = "—" if r.p_adjusted is None else f"{r.p_adjusted:.2g}"
    expect = f"a {c.expect} than b" if c.expect != "equal" else f"a = b within +-{c.margin:g}"
    return (f"| {c.label} | {_sel(c.a)} | {b} | {expect} | {r.figure()} | {r.test or '—'} | {p} | {q} "
            f"| {r.n_seeds} | {r.outcome_text()} |")


def _sel(selector) -> str:
    return ", ".join(f"{k}={v}" for k, v in (selector or {}).items())


def verdict_section(verdict: Verdict, plot: Path | None = None) -> str:
    claim = verdict.claim
    head = ("| comparison | a | b | claim | a - b [interval] | test | p | Holm p | seeds | outcome |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [
        f"## Verdict: {claim.name}",
        "",
        f"> {claim.statement}",
        "",
        f"Source: {claim.source}. The source's own figures: {claim.source_figures}.",
        "",
        f"**Verdict: {verdict.text()}.**",
        "",
        head,
        *[_row(r) for r in verdict.results],
        "",
        *[f"- {r.sentence()}" for r in verdict.results],
    ]
    if verdict.reported:
        lines += ["", "Shown beside the verdict, not part of it:", "", head, *[_row(r) for r in verdict.reported],
                  "", *[f"- {r.sentence()}" for r in verdict.reported]]
    lines += [
        "",
        f"Method: cells pair by seed (same seed = same initial weights and batches) and by every other axis the "
        f"two sides share; p-values of the {len(verdict.results)} comparison(s) are corrected together "
        f"({CORRECTION.title()}) at alpha {claim.alpha:g}. A comparison agrees when its adjusted p is below alpha "
        "in the claimed direction (equivalence: TOST within the stated margin), does not agree when it is below "
        "alpha the other way, and otherwise cannot tell; 'about M would tell' is the number of seeds at which the "
        "test reaches 80% power for the observed effect. The claim agrees only when every comparison agrees. "
        "analysis/claims.py states each rule.",
    ]
    if plot is not None:
        lines += ["", f"![{claim.name}](plots/{plot.name})"]
    return "\n".join(lines)


def write_claim_report(claim: Claim, out: Path, full: bool = True) -> tuple[Path, Verdict]:
    """report.md (the verdict section on top of `ablate report`'s report; with full=False the
    verdict section alone), plots/claim_<name>.png and verdict.json for a grid folder that ran
    the claim's grid."""
    from ablate.analysis.claim_measures import Context
    from ablate.analysis.claim_plots import write_claim_plot

    if full:
        from ablate.analysis.analyse import analyse

        analysis = analyse(out)
        runs, metrics = analysis.runs, analysis.metrics
    else:
        from ablate.analysis.load import load_runs
        from ablate.analysis.metrics import cell_metrics

        runs = load_runs(out)
        metrics = cell_metrics(runs)
    verdict = evaluate(claim, runs, metrics)
    pngs = [p for p in write_claim_plot(claim, Context(runs, metrics), out / "plots") if p.suffix == ".png"]
    section = verdict_section(verdict, pngs[0] if pngs else None)
    if full:
        from ablate.analysis.report import write_report

        path = write_report(out, preamble_sections=[section], analysis=analysis)
    else:
        path = out / "report.md"
        path.write_text(f"# Claim: {claim.name}\n\n{section}\n")
    (out / VERDICT_JSON).write_text(json.dumps(verdict.as_dict(), indent=2, default=str) + "\n")
    return path, verdict


def write_index(entries: list[tuple[Claim, Path, Verdict | None]], path: Path) -> Path:
    """One table linking every claim's report: claim, source, verdict, key figure."""
    lines = ["# Claims: verdicts", "",
             "Each row links the claim's report (its verdict section is at the top).", "",
             "| claim | source | verdict | key figure | report |", "|---|---|---|---|---|"]
    for claim, out, verdict in entries:
        link = Path(_relative(out / "report.md", path.parent))
        if verdict is None:
            lines.append(f"| {claim.name} | {claim.source} | not run | — | [{claim.name}]({link.as_posix()}) |")
            continue
        first = verdict.results[0]
        lines.append(f"| {claim.name} | {claim.source} | {verdict.text()} | {first.compare.label}: {first.figure()} "
                     f"| [{claim.name}]({link.as_posix()}) |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _relative(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target.resolve(), start.resolve())
