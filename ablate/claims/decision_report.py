"""The report of a sequential decision (`ablate reproduce CLAIM --decide`): per clause, each
look's seeds, statistic and boundary, the decision and why it stopped, and a small plot of the
running statistic against seeds (ablate/claims/sequential.py computes them; nothing here decides).

    write_decision_report(claim, out, decision, stopped="") -> report.md (+ plots/decide_<name>.png)
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from ablate.analysis.outcomes import SCORING_RULE  # noqa: E402
from ablate.analysis.plots import save_figure  # noqa: E402
from ablate.claims.claim_report import sentence  # noqa: E402
from ablate.claims.sequential import ClauseDecision, Decision
from ablate.claims.spending import LOOKS  # noqa: E402
from ablate.core.safe_files import replace_atomic  # noqa: E402

AGREE_COLOUR, FUTILE_COLOUR, BOUNDARY_COLOUR = "#1b7837", "#b2182b", "#444444"


def _g(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    return ("∞" if x > 0 else "-∞") if math.isinf(x) else f"{x:.{digits}g}"


def looks_table(c: ClauseDecision) -> list[str]:
    """A markdown table of the clause's looks."""
    rows = ["| seeds | z (agrees) | z (no effect as large) | boundary | nominal level | estimate | outcome |",
            "|---:|---:|---:|---:|---:|---:|---|"]
    for lk in c.looks:
        rows.append(f"| {lk.n_seeds} | {_g(lk.statistic)} | {_g(lk.futility_statistic)} | {_g(lk.boundary)} | "
                    f"{_g(lk.nominal_level, 2)} | {_g(lk.estimate)} | {lk.outcome} |")
    return rows


def clause_section(c: ClauseDecision) -> list[str]:
    lines = [f"### ({c.letter}) {c.label}: **{c.status}**", "", f"Why it stopped: {c.why}.", "",
             f"Level: one-sided {c.level:.3g} (Holm's share of alpha when it was decided); unit: the seed; "
             f"the test is about {c.estimand or 'the median seed'}.", ""]
    if c.rates:
        lines += ["Rates chosen on the sweep's seeds: " + "; ".join(f"{side}: lr {v}" for side, v in c.rates.items()),
                  ""]
    if c.looks and math.isfinite(c.looks[-1].boundary):
        lines += looks_table(c) + [""]
    if not c.decided and c.next_seeds:
        lines += [f"Next look: seeds {c.next_seeds[0]}-{c.next_seeds[-1]} ({len(c.next_seeds)} seeds).", ""]
    lines += [f"- {sentence(r)}" for r in c.results]
    return lines


def decision_section(decision: Decision, stopped: str = "", plot: str | None = None) -> str:
    claim = decision.claim
    lines = [f"## Decision: {claim.name}", "", f"> {claim.statement}", "", f"**Verdict: {decision.headline}.**", ""]
    if stopped:
        lines += [f"The looks ended: {stopped}.", ""]
    lines += [f"- {c.line}" for c in decision.clauses]
    if plot:
        lines += ["", f"![{claim.name}: the running statistic against seeds](plots/{plot})"]
    for c in decision.clauses:
        lines += ["", *clause_section(c)]
    lines += ["", method_note(decision)]
    return "\n".join(lines)


def method_note(decision: Decision) -> str:
    return (f"Method (ablate/claims/sequential.py and ablate/claims/claim_file.py state every rule with its reference): the unit "
            f"is the seed; each clause is looked at when it has {', '.join(map(str, LOOKS))} seeds (fresh seeds for "
            f"a best-rate comparison) and gets more only while undecided. Each look tests at its own nominal level "
            f"from the Lan-DeMets O'Brien-Fleming spending of one-sided {decision.claim.alpha:g}, so the error rate "
            f"holds however the looks end; \"does not agree: no effect as large as X\" reads the same boundary "
            f"(non-binding futility). Every test is the exact sign test over seeds, about the median seed, valid "
            f"however skewed the seeds' values. Clauses share alpha by graphical Holm: only a clause shown the "
            f"claimed way passes its share on, never one stopped for futility; the headline, a conjunction, agrees "
            f"when every clause is shown at the full level. The looks' seeds are the grid's own, then the next "
            f"integers. Failed training runs are counted: {SCORING_RULE}.")


def plot_running_statistic(decision: Decision, path: Path, dpi: int = 110) -> Path | None:
    """One small panel per clause: z of "agrees" and of "no effect as large" against seeds, with
    the boundary at each look. None when no clause has a look with a statistic."""
    clauses = [c for c in decision.clauses if any(lk.statistic is not None or lk.futility_statistic is not None
                                                  for lk in c.looks)]
    if not clauses:
        return None
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8):
        fig, axes = plt.subplots(1, len(clauses), figsize=(3.2 * len(clauses), 3.0), squeeze=False)
        for ax, c in zip(axes[0], clauses):
            seeds = [lk.n_seeds for lk in c.looks]
            for attr, colour, label in (("statistic", AGREE_COLOUR, "agrees"),
                                        ("futility_statistic", FUTILE_COLOUR, "no effect as large")):
                values = [getattr(lk, attr) for lk in c.looks]
                points = [(n, max(-12.0, min(v, 12.0))) for n, v in zip(seeds, values) if v is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", color=colour, label=label)
            ax.plot(seeds, [lk.boundary for lk in c.looks], ls="--", marker="_", color=BOUNDARY_COLOUR,
                    label="boundary")
            ax.set_xticks(list(LOOKS))
            ax.set_xlim(0, LOOKS[-1] + 1)
            ax.set_xlabel("seeds")
            ax.set_ylabel("z")
            ax.set_title(f"({c.letter}) {c.status}", fontsize=9)
        labelled = {}  # every line any panel drew, once: the first panel may lack the futility line
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                labelled.setdefault(label, handle)
        axes[0][0].legend(list(labelled.values()), list(labelled), fontsize=7, loc="best")
        fig.suptitle(f"{decision.claim.name}: each look's statistic and boundary", fontsize=10)
        fig.tight_layout()
        save_figure(fig, path, dpi)
        plt.close(fig)
    return path


def write_decision_report(claim, out: Path, decision: Decision, *, cells: Path | None = None,
                          stopped: str = "") -> Path:
    """report.md in `out` with the decision section and its plot (plots/decide_<name>.png).
    `cells`: the grid folder the cells live in (unused here: the decision carries its results)."""
    out = Path(out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plot = plot_running_statistic(decision, out / "plots" / f"decide_{claim.name}.png")
    text = f"# Claim: {claim.name} (seeds until decided)\n\n{decision_section(decision, stopped, plot and plot.name)}\n"
    path = out / "report.md"
    # A fresh file renamed into place: a planted link at the name is replaced, never written through.
    replace_atomic(path, lambda f: f.write(text.encode()), fsync=False)
    return path
