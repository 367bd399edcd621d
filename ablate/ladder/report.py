"""A ladder's report: each rung's clause verdicts (ablate/claims/verdict.py, on the rung's own run
folder), and for each clause's primary effect its value at every rung, the trend against model
size, the prediction at the next size up and at ANDREA-120M, and a compute multiplier for loss
effects. The backtest of a held-out rung is ablate/ladder/backtest.py's.

Reads what `ablate ladder` wrote: ladder.json (the rungs, their rates and sizes) and one grid
folder per rung. The numbers:

  effect      the clause's first comparison: the mean over paired units of a - b (or of a - `than`),
              with the t interval of that mean; read against the test's null (the margin for
              non-inferiority, else 0), so "holds" means on the claimed side of it
  se          the standard error of that mean; for a failure count whose differences do not
              vary, the count's resolution 1 / (2 n) (else one rung would weigh infinitely)
  size        the rung's non-embedding parameters (Kaplan et al. 2020's N); the trend is linear
              in log10(N) (ablate/ladder/scaling.py states the fit and its intervals)
  multiplier  for a loss comparison with two arms: how much compute the baseline (b) needs to
              reach a's final validation loss, per seed on the arms' own curves, at each arm's
              chosen rate (ablate/ladder/scaling.reach says which curve, and never extrapolates)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ablate.analysis.cpu_forms import mix_note
from ablate.analysis.load import load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.claims.claim_file import claim_at_rung
from ablate.claims.claim_measures import MEASURES
from ablate.claims.selection import select
from ablate.claims.verdict import at_best_lr, evaluate
from ablate.core.bounded_read import LISTING_BYTES, read_json
from ablate.core.safe_files import write_text_atomic
from ablate.ladder import scaling

LADDER_JSON, RESULT_JSON, REPORT_MD = "ladder.json", "ladder_result.json", "ladder.md"
LOSS_MEASURES = ("final_val_loss",)




def _g(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.{digits}g}"


def _size(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


# --------------------------------------------------------------------------- one rung


def expected_sign(compare) -> int:
    return 1 if compare.higher else -1


def null_of(compare) -> float:
    if compare.margin is not None and compare.expect in ("not_higher", "not_lower"):
        return compare.margin if compare.expect == "not_higher" else -compare.margin
    return 0.0


def rung_effect(result, binary: bool, alpha: float) -> dict:
    """The clause's primary effect at one rung: mean a - b with its t interval and se."""
    d = np.subtract(np.asarray(result.a, dtype=float), np.asarray(result.b, dtype=float))
    d = d[np.isfinite(d)]
    if d.size == 0:
        return {"effect": None, "low": None, "high": None, "se": None, "n": 0}
    mean = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else None
    if binary and (se is None or se == 0):
        se = 1.0 / (2 * d.size)
    if se is None or se == 0:
        return {"effect": mean, "low": mean, "high": mean, "se": 0.0, "n": int(d.size)}
    half = stats.t.ppf(1 - alpha / 2, max(d.size - 1, 1)) * se
    return {"effect": mean, "low": mean - half, "high": mean + half, "se": se, "n": int(d.size)}


def _best_text(result) -> str:
    parts = [f"{side}: {lr:g}{' (edge)' if edge else ''}" for side, picks in result.best.items()
             for _, lr, edge in picks]
    return "; ".join(parts)


def rung_curves(runs, cells, key: str = "val_loss") -> dict:
    """cell id -> (steps, losses) of its logged validation losses."""
    steps = runs.steps
    if key not in steps:
        return {}
    rows = steps[steps["cell_id"].isin(cells) & steps[key].notna()]
    return {cid: (g["step"].to_numpy(float), g[key].to_numpy(float)) for cid, g in rows.groupby("cell_id")}


def rung_multiplier(runs, metrics, compare, alpha: float) -> dict | None:
    """The compute multiplier of a over b at one rung, per seed (ablate/ladder/scaling.reach)."""
    if compare.measure not in LOSS_MEASURES or compare.b is None:
        return None
    sides = {}
    for side in ("a", "b"):
        cells = metrics[select(metrics, compare.selector(side))]
        if compare.best_lr:
            cells, _ = at_best_lr(cells, runs.varying_axes)
        if cells.empty or cells["seed"].duplicated().any():
            return {"note": "several cells per seed on a side: no single curve to read"}
        sides[side] = cells.set_index("seed")
    curves = rung_curves(runs, [*sides["a"]["cell_id"], *sides["b"]["cell_id"]])
    reaches = []
    for seed in sorted(set(sides["a"].index) & set(sides["b"].index)):
        a, b = sides["a"].loc[seed], sides["b"].loc[seed]
        if a["cell_id"] not in curves or b["cell_id"] not in curves:
            continue
        flops_a, flops_b = float(a["params"]), float(b["params"])  # per token, up to the same 6 x tokens
        reaches.append(scaling.reach(curves[b["cell_id"]], curves[a["cell_id"]], flops_b, flops_a))
    return scaling.multiplier_summary(reaches, alpha) if reaches else None


# -------------------------------------------------------------------------- the ladder


def load_ladder(out: Path) -> dict:
    """ladder.json, through the bounded reader: a damaged one is UnreadableFile (one line, exit 2)."""
    return read_json(Path(out) / LADDER_JSON, top=dict, limit=LISTING_BYTES)


def evaluate_rungs(claim, out: Path, ladder: dict) -> list[dict]:
    """[{rung record, verdict, runs, metrics}] for every rung, smallest first."""
    rungs = []
    for record in ladder["rungs"]:
        rung_claim = claim_at_rung(claim, {float(k): v for k, v in record["rates"].items()}, ladder.get("ref_width"),
                                   record.get("width"))
        runs = load_runs(Path(out) / record["folder"], listed_only=True)  # the rung's own sweep, not an earlier one
        metrics = cell_metrics(runs)
        rungs.append({"record": record, "claim": rung_claim, "runs": runs, "metrics": metrics,
                      "verdict": evaluate(rung_claim, runs, metrics)})
    return rungs


def clause_across(rungs: list[dict], i: int, targets: dict, alpha: float) -> dict:
    """One clause across the rungs: its per-rung rows, the trend, the predictions, a sentence."""
    first = rungs[0]["verdict"].clauses[i]
    compare = first.results[0].compare
    binary = MEASURES[compare.measure].test == "binary"
    null, sign = null_of(compare), expected_sign(compare)
    rows = []
    for rung in rungs:
        clause = rung["verdict"].clauses[i]
        result = clause.results[0]
        effect = rung_effect(result, binary, alpha)
        claim_c = rung["claim"].clauses[i].compare[0]
        rows.append({"rung": rung["record"]["name"], "size": rung["record"]["size"], **effect,
                     "verdict": clause.outcome, "best_lr": _best_text(result),
                     "multiplier": rung_multiplier(rung["runs"], rung["metrics"], claim_c, alpha)})
    exact = MEASURES[compare.measure].test == "exact"
    out = {"label": first.clause.label, "measure": compare.measure, "null": null, "expected_sign": sign,
           "rows": rows, "exact": exact}
    out.update(counted_sentence(rows, null, sign) if exact else trend_and_sentence(rows, null, sign, targets, alpha))
    return out


def counted_sentence(rows: list[dict], null: float, sign: int) -> dict:
    """An exact count (parameters) is counted at every size, not fitted: its value at another
    size is a count of that model, not a prediction."""
    rel = [r["effect"] - null for r in rows if r["effect"] is not None]
    sizes = [r["size"] for r in rows if r["effect"] is not None]
    changes = scaling.sign_changes(sizes, rel)
    if rel and all(x * sign > 0 for x in rel):
        text = "holds at every size (counted, not fitted)"
    elif changes:
        text = "changes sign between " + ", ".join(f"{_size(a)} and {_size(b)}" for a, b in changes) + " (counted)"
    else:
        text = "goes the other way at every size (counted, not fitted)"
    return {"trend": None, "predictions": {}, "sentence": text}


def trend_and_sentence(rows: list[dict], null: float, sign: int, targets: dict, alpha: float) -> dict:
    usable = [r for r in rows if r["effect"] is not None and r["se"] is not None]
    if len({r["size"] for r in usable}) < 2:
        return {"trend": None, "predictions": {}, "sentence": "too few rungs with a value for a trend"}
    sizes = [r["size"] for r in usable]
    rel = [r["effect"] - null for r in usable]
    df = max(1, min(r["n"] for r in usable) - 1)
    trend = scaling.fit_trend(sizes, rel, [r["se"] for r in usable], df, alpha)
    lo, hi = trend.slope_interval()
    preds = {}
    for name, size in targets.items():
        if name.startswith("_"):
            continue
        mean, plo, phi = trend.predict(size)
        preds[name] = {"size": size, "effect": mean + null, "low": plo + null, "high": phi + null}
    holds = [x * sign > 0 for x in rel]
    word = scaling.trend_word(trend, sign)
    changes = scaling.sign_changes(sizes, rel)
    against = f" (against the margin {abs(null):g})" if null else ""
    if all(holds):
        text = f"holds at every size{against}, {word}"
    elif changes:
        text = "changes sign between " + ", ".join(f"{_size(a)} and {_size(b)}" for a, b in changes)
    else:
        text = f"goes the other way at every size{against}, {word}"
    return {"trend": {"intercept": trend.intercept, "slope": trend.slope, "low": lo, "high": hi, "df": trend.df, "birge": trend.birge,
                      "word": word}, "predictions": preds, "sentence": text}


def summarise(claim, out: Path) -> dict:
    ladder = load_ladder(out)
    rungs = evaluate_rungs(claim, out, ladder)
    targets = ladder["targets"]
    clauses = [clause_across(rungs, i, targets, claim.alpha) for i in range(len(claim.clauses))]
    return {"claim": claim.name, "statement": claim.statement, "scale": ladder["scale"],
            "seconds": ladder.get("seconds"), "ref_width": ladder.get("ref_width"), "rungs": [r["record"] for r in rungs],
            "rung_verdicts": {r["record"]["name"]: r["verdict"].text() for r in rungs},
            "clauses": clauses, "sentences": [f"{c['label']}: {c['sentence']}" for c in clauses],
            "notes": [n for n in [mix_note(pd.concat([r["runs"].cells for r in rungs]))] if n] if rungs else [],
            "sentence_count": len(clauses), "targets": {k: v for k, v in targets.items() if not k.startswith("_")},
            "_rungs": rungs}


def write_ladder_report(claim, out: Path) -> dict:
    from ablate.ladder.plots import write_ladder_plots  # lazy: matplotlib, seaborn only when used
    from ablate.analysis.report import PLOTS_DIR

    summary = summarise(claim, Path(out))
    plots = write_ladder_plots(summary, Path(out) / PLOTS_DIR)
    rungs = summary.pop("_rungs")
    del rungs
    write_text_atomic(Path(out) / RESULT_JSON, json.dumps(summary, indent=2, default=str) + "\n")
    write_text_atomic(Path(out) / REPORT_MD, ladder_markdown(summary, plots))
    return summary


# ---------------------------------------------------------------------------- the text


def ladder_markdown(summary: dict, plots: dict) -> str:
    lines = [f"# Ladder: {summary['claim']}", "", f"> {summary['statement']}", "",
             "Rungs: the width at the claim's depth; every learning rate x (the grid's width / the rung's), and "
             "moved a step of the sweep where the rung below's best rate sat at an end of it (ablate/ladder/rungs.py):", "",
             "| rung | non-embedding params | lr factor | sweep moved | verdict |", "|---|---:|---:|---|---|"]
    ref = summary.get("ref_width")
    for r in summary["rungs"]:
        moved = _moved(r["rate_factor"] * r["width"] / ref) if ref else "-"
        lines.append(f"| {r['name']} | {r['size']:,} | {r['rate_factor']:.3g} | {moved} | "
                     f"{summary['rung_verdicts'][r['name']]} |")
    for c in summary["clauses"]:
        lines += ["", f"## {c['label']}: {c['sentence']}", "",
                  f"Effect: {c['measure']}, a - b (claimed {'above' if c['expected_sign'] > 0 else 'below'} "
                  f"{c['null']:g}); t interval over paired units.", "",
                  "| rung | params | effect [95% CI] | n | verdict | best lr | compute multiplier |",
                  "|---|---:|---|---:|---|---|---|"]
        for r in c["rows"]:
            lines.append(f"| {r['rung']} | {_size(r['size'])} | {_g(r['effect'])} [{_g(r['low'])}, {_g(r['high'])}] | "
                         f"{r['n']} | {r['verdict']} | {r['best_lr'] or '-'} | {multiplier_text(r['multiplier'])} |")
        t = c["trend"]
        if t:
            lines += ["", f"Trend: {t['slope']:+.3g} per decade of parameters [{t['low']:+.3g}, {t['high']:+.3g}] "
                          f"({t['word']}; t with {t['df']} df; scatter about the line x{t['birge']:.2f})."]
            for name, p in c["predictions"].items():
                lines.append(f"- predicted at {name} ({_size(p['size'])} params, extrapolated): {_g(p['effect'])} "
                             f"[{_g(p['low'])}, {_g(p['high'])}] (95% prediction interval)")
    lines += [f"\n**Note: {note}**" for note in summary.get("notes", [])]
    if plots:
        lines += ["", *[f"![{k}](plots/{Path(v).name})" for k, v in plots.items()]]
    if summary.get("seconds") is not None:
        lines += ["", f"Ladder run time: {summary['seconds'] / 60:.1f} min (each rung's grid run, as recorded when "
                      "it trained its cells)."]
    return "\n".join(lines) + "\n"


def _moved(shift: float) -> str:
    """The sweep's move against the plain 1/width transfer, in sweep steps' terms."""
    if abs(math.log(shift)) < 1e-6:
        return "-"
    return f"x {shift:.3g} ({'up' if shift > 1 else 'down'})"


def multiplier_text(m: dict | None) -> str:
    if not m:
        return "-"
    if m.get("note"):
        return m["note"]
    if m["factor"] is None:
        return f"not reached inside the run ({m['seeds']} seeds)"
    ci = f" [{m['low']:.2f}, {m['high']:.2f}]" if m["low"] is not None else ""
    how = {("baseline",): "baseline's curve", ("other",): "other arm's curve (the baseline did not reach it "
           "inside the run)"}.get(tuple(m["how"]), "baseline's curve in some seeds, the other arm's in others")
    missing = f"; none in {m['seeds'] - m['measured']} seeds" if m["measured"] < m["seeds"] else ""
    return f"{m['factor']:.2f}x{ci} (on the {how}{missing})"
