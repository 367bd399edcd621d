"""The backtest: a ladder's held-out rung (the width above the fitted ones) predicted from the
fitted rungs under a plan frozen before it trained, and scored so that the score can fail.

The plan (PLAN_JSON in the ladder's folder) is written after the fitted rungs and before the
held-out rung trains: the claim and grid files' sha256, the code (its git commit where there is
one, the package version and a sha256 over the analysis sources), the rate-transfer rule, the
held-out rung's grid file, and every clause's prediction. A run under another plan (any of these
changed, the commit aside: it is recorded for the reader, the sources' hash is what decides) is
refused, before anything trains and again when scoring. The plan carries a sha256 over all it
holds (PLAN_DIGEST), so a plan edited after freezing (a forecast moved toward what the held-out
rung measured) is refused too: the digest is no signature, but an edit must be deliberate.

The statistics, with the seed as the unit:

  rung effect   each seed's mean of a - b over its cells of the clause's first comparison (its
                rates, warmups), then the mean over seeds; n = seeds
  noise         sigma^2, the seeds' variance about their rung's mean pooled over the fitted rungs
                (df = sum of seeds - 1): one per-seed noise, so no rung's weight rests on its own
                few-seed variance. A failure share whose seeds never vary gets the share's
                resolution, 1 / (2 cells), as its floor
  trend         the least-squares line of the effect on log10(non-embedding parameters), rung i
                weighted by n_i / sigma^2; at least MIN_FIT_RUNGS rungs (with two a line is not
                tested by anything, so it says "too few rungs to predict")
  forecasts     Student t (df of the pooled noise) for what the held-out rung will MEASURE:
                trend        line(N) with the line's variance there, plus sigma^2 / n_new;
                persistence  the top fitted rung's effect, variance sigma^2 (1 / n_top + 1 / n_new);
                no change    0, variance sigma^2 / n_new
  scores        CRPS (continuous ranked probability score, Gneiting & Raftery 2007, the Student t
                closed form) and the interval score of the central 1 - 2 alpha interval; lower is
                better; in the clause's own unit, so summarised per unit, never across units
  rejection     the held-out rung's one-sided t test over seeds of the first comparison at alpha
                (the same object on both sides: not the clause's multiplicity-adjusted verdict);
                each forecast gives it a probability (a noncentral t averaged over the forecast's
                location), scored by the Brier score
  decision      DataDecide's decision accuracy (Magnusson et al. 2025): does the small-scale
                decision (the sign of a - b: which arm is larger) pick the same winner as the
                held-out rung measured; a tie (a measured or forecast 0) picks no winner and is
                counted apart, not as wrong; Clopper-Pearson interval over clauses
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import special, stats

from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.claims.claim_measures import MEASURES
from ablate.core.bounded_read import UnreadableFile, read_json
from ablate.core.safe_files import replace_atomic
from ablate.ladder.report import evaluate_rungs, expected_sign, load_ladder, null_of

PLAN_JSON, BACKTEST_MD = "backtest_plan.json", "backtest.md"
MIN_FIT_RUNGS = 3
TOO_FEW_RUNGS = "too few rungs to predict"
TOO_FEW_SEEDS = "too few seeds to predict"
NO_SPREAD = "the seeds do not vary at any fitted rung: no noise to predict with"
FORECASTS = ("trend", "persistence", "no change")
class BacktestError(ValueError):
    """A plan or held-out rung the backtest refuses; the command reports it in one line (exit 2)."""


RATE_TRANSFER = ("every learning rate x (grid width / rung width); a rung's sweep moves one step toward an "
                 "arm's best rate that sat at an end of the rung below's sweep (ablate/ladder/rungs.py)")
# The identity's part recorded for the reader and not compared: the sources' hash decides.
NOT_COMPARED = ("commit",)
PLAN_DIGEST = "plan_sha256"  # over everything else in the plan: forecasts, fitted rows, identity


# ------------------------------------------------------------------------------ the plan


def sha256_file(path) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and Path(path).is_file() else None


def plan_digest(plan: dict) -> str:
    """The sha256 of everything the plan holds but its digest, in one canonical JSON text."""
    body = {k: v for k, v in plan.items() if k != PLAN_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_sealed(plan: dict, path: Path) -> None:
    """Refuse a plan whose content is not what was frozen (one line)."""
    stored = plan.get(PLAN_DIGEST)
    if stored != plan_digest(plan):
        what = "has no " + PLAN_DIGEST if stored is None else f"does not match its {PLAN_DIGEST} {_short(stored)}"
        raise BacktestError(f"{path}: the frozen plan {what}: its forecasts, fitted rungs or identity were edited "
                            "after freezing; valid: the plan as `ablate ladder --backtest` froze it, or another --out")


def _differences(old: dict, new: dict) -> list[str]:
    """The identity's keys (`new`'s) on which a stored plan differs."""
    return [k for k in sorted(set(new) - set(NOT_COMPARED)) if old.get(k) != new.get(k)]


def load_plan(out: Path) -> dict | None:
    path = Path(out) / PLAN_JSON
    if not path.is_file():
        return None
    try:
        return read_json(path, top=dict)
    except UnreadableFile as e:  # a FIFO, too large, not JSON, nested, not an object
        raise BacktestError(f"{path}: not a backtest plan ({e.why}); valid: the file `ablate ladder --backtest` "
                            "wrote") from None
    except OSError as e:
        raise BacktestError(f"{path}: not a backtest plan ({e.strerror or e}); valid: the file `ablate ladder "
                            "--backtest` wrote") from None


def check_plan(out: Path, identity: dict, held_out_started: bool) -> None:
    """Refuse (one line) a ladder whose frozen plan differs from `identity`, or whose held-out
    rung has cells but no plan (trained where nothing froze the predictions)."""
    plan = load_plan(out)
    if plan is None:
        if held_out_started:
            raise BacktestError(f"{Path(out) / identity['held_out']}: the held-out rung has cells trained without a "
                              f"frozen plan ({PLAN_JSON}); valid: another --out, or remove that rung's folder")
        return
    changed = _differences(plan, identity)
    if changed:
        what = ", ".join(f"{k} {_short(plan.get(k))} -> {_short(identity.get(k))}" for k in changed)
        raise BacktestError(f"{Path(out) / PLAN_JSON}: the held-out rung {plan.get('held_out')} was planned under "
                          f"another plan ({what}); valid: the plan's files and code, or another --out")
    _check_sealed(plan, Path(out) / PLAN_JSON)


def _short(value) -> str:
    text = str(value)
    return text[:12] if isinstance(value, str) and len(text) == 64 else text


def freeze_plan(claim, out: Path, identity: dict, held_out: dict, ladder: dict) -> dict:
    """Write the plan with every clause's forecasts from the fitted rungs (the rungs already in
    ladder.json), before the held-out rung trains. An existing plan is kept as it is (the same
    identity, checked before the ladder ran) when it froze the same held-out grid."""
    path = Path(out) / PLAN_JSON
    plan = load_plan(out)
    if plan is not None:
        _check_sealed(plan, path)
        if plan.get("held_out_grid_sha256") != held_out["grid_sha256"]:
            raise BacktestError(f"{path}: the held-out rung's grid differs from the one frozen in the plan (its rates "
                              f"{plan.get('held_out_rates')} -> {held_out['rates']}); valid: another --out")
        return plan
    fitted = {"rungs": [r for r in ladder["rungs"] if r["name"] != identity["held_out"]],
              **{k: v for k, v in ladder.items() if k != "rungs"}}
    rows = clause_rows(claim, out, fitted)
    clauses = [{"label": c["label"], "unit": c["unit"], "measure": c["measure"], "null": c["null"],
                "expected_sign": c["expected_sign"], "fitted": c["rows"],
                "forecasts": forecasts(c["rows"], held_out["size"], c["binary"], held_out.get("seeds")) if not c["exact"]
                else {"note": "counted, not predicted"}} for c in rows]
    plan = {**identity, "held_out_grid_sha256": held_out["grid_sha256"], "held_out_rates": held_out["rates"],
            "held_out_size": held_out["size"], "clauses": clauses}
    plan[PLAN_DIGEST] = plan_digest(plan)
    replace_atomic(path, lambda f: f.write((json.dumps(plan, indent=2) + "\n").encode()))
    return plan


# ----------------------------------------------------------------------- per-seed effects


def seed_effects(result) -> tuple[np.ndarray, int]:
    """Each seed's mean of a - b over its paired cells; and the most cells one seed has."""
    groups: dict = {}
    for key, a, b in zip(result.keys, result.a, result.b):
        d = float(a) - float(b)
        if math.isfinite(d):
            groups.setdefault(key[0] if isinstance(key, tuple) else key, []).append(d)
    means = np.array([np.mean(v) for v in groups.values()], dtype=float)
    return means, max((len(v) for v in groups.values()), default=0)


def rung_row(result, name: str, size: float) -> dict:
    d, cells = seed_effects(result)
    n = int(d.size)
    return {"rung": name, "size": float(size), "n": n, "cells_per_seed": cells,
            "effect": float(d.mean()) if n else None,
            "ss": float(np.sum((d - d.mean()) ** 2)) if n else None,  # the seeds' squared deviations
            "se": float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else None}


def clause_rows(claim, out: Path, ladder: dict) -> list[dict]:
    """Per clause: its first comparison's per-seed effect at every rung of `ladder`."""
    rungs = evaluate_rungs(claim, out, ladder)
    clauses = []
    for i, clause in enumerate(claim.clauses):
        compare = clause.compare[0]
        measure = MEASURES[compare.measure]
        rows = [rung_row(r["verdict"].clauses[i].results[0], r["record"]["name"], r["record"]["size"])
                for r in rungs]
        for row, r in zip(rows, rungs):
            row["verdict"] = r["verdict"].clauses[i].outcome
        clauses.append({"label": clause.label, "measure": compare.measure, "unit": measure.unit,
                        "null": null_of(compare), "expected_sign": expected_sign(compare), "rows": rows,
                        "exact": measure.test == "exact", "binary": measure.test == "binary"})
    return clauses


# --------------------------------------------------------------------------- forecasts


@dataclass(frozen=True)
class Forecast:
    """What the held-out rung will measure: location + scale * Student t(df). `location_var`
    is the part of scale^2 from not knowing the true effect (the rest is the rung's own noise)."""

    location: float
    scale: float
    df: float
    location_var: float
    noise_var: float
    n_new: int

    def interval(self, alpha: float) -> tuple[float, float]:
        half = stats.t.ppf(1 - alpha, self.df) * self.scale
        return self.location - half, self.location + half


def pooled_noise(rows: list[dict], binary: bool) -> tuple[float, int]:
    """sigma^2 of one seed's effect, pooled over the rungs, and its degrees of freedom."""
    df = sum(r["n"] - 1 for r in rows if r["n"] > 1)
    if df < 1:
        return 0.0, 0
    var = sum(r["ss"] for r in rows if r["n"] > 1) / df
    if binary:
        cells = max(r["cells_per_seed"] for r in rows)
        var = max(var, (1.0 / (2 * max(cells, 1))) ** 2)  # a share's resolution, where seeds never vary
    return var, df


def forecasts(rows: list[dict], size: float, binary: bool = False, n_new: int | None = None) -> dict:
    """{"trend": Forecast, "persistence": ..., "no change": ...} as dicts, or {"note": why not}:
    for a rung of `size` measured on `n_new` seeds (by default the top fitted rung's)."""
    rows = sorted([r for r in rows if r["effect"] is not None and r["n"] > 0], key=lambda r: r["size"])
    if len({r["size"] for r in rows}) < MIN_FIT_RUNGS:
        return {"note": TOO_FEW_RUNGS}
    var, df = pooled_noise(rows, binary)
    if df < 2:  # a t with under 2 df has no mean, its CRPS no value
        return {"note": TOO_FEW_SEEDS}
    if var <= 0:  # e.g. every cell scored as the unigram entropy on both sides
        return {"note": NO_SPREAD}
    x = np.log10([r["size"] for r in rows])
    design = np.column_stack([np.ones_like(x), x])
    weights = np.array([r["n"] for r in rows], dtype=float) / var
    cov = np.linalg.inv(design.T @ (design * weights[:, None]))
    beta = cov @ (design.T @ (weights * np.array([r["effect"] for r in rows])))
    at = np.array([1.0, math.log10(size)])
    top = rows[-1]
    n_new = n_new or top["n"]
    noise = var / n_new
    made = {"trend": (float(at @ beta), float(at @ cov @ at)),
            "persistence": (top["effect"], var / top["n"]), "no change": (0.0, 0.0)}
    resid = np.array([r["effect"] for r in rows]) - design @ beta
    chi2 = float(np.sum(weights * resid ** 2))
    out = {name: asdict(Forecast(loc, math.sqrt(lv + noise), df, lv, noise, n_new)) for name, (loc, lv) in made.items()}
    out["line"] = {"intercept": float(beta[0]), "slope": float(beta[1]), "chi2": chi2, "dof": len(rows) - 2,
                   "p_fit": float(stats.chi2.sf(chi2, len(rows) - 2)), "noise_var": var, "noise_df": df}
    return out


# ------------------------------------------------------------------------------ scores


def crps_t(y: float, location: float, scale: float, df: float) -> float:
    """CRPS of a location-scale Student t (df > 1) at y, in y's unit (Gneiting & Raftery 2007;
    the t's closed form, e.g. Jordan, Krueger & Lerch 2019's scoringRules)."""
    z = (y - location) / scale
    nu = df
    pdf, cdf = stats.t.pdf(z, nu), stats.t.cdf(z, nu)
    spread = 2 * math.sqrt(nu) * special.beta(0.5, nu - 0.5) / ((nu - 1) * special.beta(0.5, nu / 2) ** 2)
    return float(scale * (z * (2 * cdf - 1) + 2 * pdf * (nu + z * z) / (nu - 1) - spread))


def interval_score(y: float, low: float, high: float, alpha: float) -> float:
    """The interval score of a central 1 - alpha interval (Gneiting & Raftery 2007, eq. 43):
    its width, plus 2 / alpha times how far y falls outside it."""
    return float((high - low) + 2 / alpha * max(low - y, 0.0) + 2 / alpha * max(y - high, 0.0))


def brier(probability: float, happened: bool) -> float:
    return float((probability - float(happened)) ** 2)


def rejection_probability(f: Forecast, null: float, sign: int, alpha: float, nodes: int = 40) -> float | None:
    """The chance that the held-out rung's one-sided t test over its n_new seeds rejects the
    null on the claimed side, at alpha: a noncentral t, averaged over the forecast's location
    (normal with variance location_var; Gauss-Hermite), the seeds' noise sigma^2 = noise_var * n_new."""
    if f.n_new < 2:
        return None
    crit = stats.t.ppf(1 - alpha, f.n_new - 1)
    se = math.sqrt(f.noise_var)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)  # for a standard normal weight
    effects = f.location + math.sqrt(max(f.location_var, 0.0)) * x
    shift = sign * (effects - null) / se
    return float(np.sum(w * stats.nct.sf(crit, f.n_new - 1, shift)) / np.sum(w))


def measured_rejection(row: dict, null: float, sign: int, alpha: float) -> bool | None:
    """The held-out rung's one-sided t over seeds: does it reject the null on the claimed side?"""
    if row["n"] < 2 or row["effect"] is None:
        return None
    gap = sign * (row["effect"] - null)
    if not row["se"]:
        return gap > 0
    return bool(gap / row["se"] > stats.t.ppf(1 - alpha, row["n"] - 1))


def winner(value: float | None) -> int:
    """Which arm a - b picks: +1 (a larger), -1 (b larger), 0 (a tie: no winner)."""
    return 0 if value is None or value == 0 else (1 if value > 0 else -1)


def score_clause(clause: dict, measured: dict, alpha: float) -> dict:
    """A clause's frozen forecasts against the held-out rung's measurement."""
    null, sign = clause["null"], clause["expected_sign"]
    t = (measured["effect"] - null) / measured["se"] if measured["se"] else None
    out = {"label": clause["label"], "unit": clause["unit"], "measured": measured, "t": t,
           "rejected": measured_rejection(measured, null, sign, alpha), "note": clause["forecasts"].get("note")}
    if out["note"] or measured["effect"] is None:
        out["note"] = out["note"] or "the held-out rung measured nothing"
        return out
    y = measured["effect"]
    for name in FORECASTS:
        f = Forecast(**clause["forecasts"][name])
        low, high = f.interval(alpha)
        p = rejection_probability(f, null, sign, alpha)
        out[name] = {"location": f.location, "low": low, "high": high, "z": (y - f.location) / f.scale,
                     "crps": crps_t(y, f.location, f.scale, f.df), "interval_score": interval_score(y, low, high, 2 * alpha),
                     "covered": low <= y <= high, "p_reject": p,
                     "brier": brier(p, out["rejected"]) if p is not None and out["rejected"] is not None else None,
                     "winner": winner(f.location)}
    out["winner"] = winner(y)
    return out


def decision_accuracy(scored: list[dict], forecast: str, confidence: float = 1 - 2 * ONE_SIDED_ALPHA) -> dict:
    """DataDecide's decision accuracy of one forecast over clauses: the share whose small-scale
    pick matches the held-out rung's, ties at either scale counted apart; Clopper-Pearson."""
    picks = [(c[forecast]["winner"], c["winner"]) for c in scored if forecast in c]
    decided = [(s, m) for s, m in picks if s and m]
    right = sum(s == m for s, m in decided)
    out = {"right": right, "of": len(decided), "ties": len(picks) - len(decided), "low": None, "high": None}
    if decided:
        ci = stats.binomtest(right, len(decided)).proportion_ci(confidence, method="exact")
        out["low"], out["high"] = float(ci.low), float(ci.high)
    return out


def score_ladder(claim, out: Path, identity: dict, alpha: float = ONE_SIDED_ALPHA) -> dict:
    """Score a ladder's held-out rung against its frozen plan; refuse (BacktestError) a held-out
    rung made under another plan."""
    plan = load_plan(out)
    if plan is None:
        raise BacktestError(f"{Path(out) / PLAN_JSON}: no frozen plan; valid: `ablate ladder {claim.name} --backtest`, "
                          "which writes it before the held-out rung trains")
    check_plan(out, identity, True)
    ladder = load_ladder(out)
    record = next((r for r in ladder["rungs"] if r["name"] == plan["held_out"]), None)
    grid_sha = sha256_file(Path(out) / record["grid_file"]) if record else None
    if record is None or grid_sha != plan["held_out_grid_sha256"]:
        raise BacktestError(f"{Path(out) / plan['held_out']}: the held-out rung was not made under the frozen plan "
                          f"(its grid file {_short(grid_sha)}, the plan's {_short(plan['held_out_grid_sha256'])}); "
                          "valid: rerun `ablate ladder --backtest` with the plan's files and code")
    measured = clause_rows(claim, out, {**ladder, "rungs": [record]})
    scored = [score_clause(c, m["rows"][0], alpha) for c, m in zip(plan["clauses"], measured)
              if not c["forecasts"].get("note") == "counted, not predicted"]
    return {"claim": claim.name, "held_out": plan["held_out"], "seconds": record.get("seconds"), "fitted": [f"w{w}" for w in plan["fitted_widths"]],
            "plan": {k: plan[k] for k in ("claim_sha256", "grid_sha256", "commit", "version", "analysis_sha256")},
            "clauses": scored, "alpha": alpha}


# ---------------------------------------------------------------------------- the table


def _g(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.{digits}g}"


def _p(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def clause_line(ladder: dict, c: dict) -> str:
    m = c["measured"]
    measured = f"{_g(m['effect'])} ± {_g(m['se']).lstrip('+')} (t {_g(c['t'])}, {m['n']} seeds)"
    head = f"| {ladder['claim']} | {c['label']} | {c['unit']} | {ladder['held_out']} |"
    rejected = {None: "-", True: "yes", False: "no"}[c["rejected"]]
    if c.get("note"):
        return f"{head} {c['note']} | {measured} | - | - | - | {rejected} | - |"
    t, p, z = c["trend"], c["persistence"], c["no change"]
    return (f"{head} {_g(t['location'])} [{_g(t['low'])}, {_g(t['high'])}] | {measured} | {_g(t['z'])} | "
            f"{t['crps']:.3g} / {p['crps']:.3g} / {z['crps']:.3g} | "
            f"{t['interval_score']:.3g} / {p['interval_score']:.3g} / {z['interval_score']:.3g} | {rejected} | "
            f"{_p(t['p_reject'])} / {_p(p['p_reject'])} / {_p(z['p_reject'])} |")


def unit_summary(scored: list[dict]) -> list[str]:
    """Per unit: how many clauses, the forecasts' mean CRPS and interval score, how often the
    trend's CRPS beat persistence's, the trend's median |error| and coverage."""
    lines = ["| unit | clauses | mean CRPS trend / persistence / no change | mean interval score trend / "
             "persistence / no change | trend beats persistence (CRPS) | trend median abs error | "
             "inside the trend's interval |", "|---|---:|---|---|---|---|---|"]
    for unit in sorted({c["unit"] for c in scored if "trend" in c}):
        group = [c for c in scored if c["unit"] == unit and "trend" in c]
        crps = [np.mean([c[f]["crps"] for c in group]) for f in FORECASTS]
        ins = [np.mean([c[f]["interval_score"] for c in group]) for f in FORECASTS]
        beats = sum(c["trend"]["crps"] < c["persistence"]["crps"] for c in group)
        error = np.median([abs(c["measured"]["effect"] - c["trend"]["location"]) for c in group])
        lines.append(f"| {unit} | {len(group)} | {' / '.join(f'{x:.3g}' for x in crps)} | "
                     f"{' / '.join(f'{x:.3g}' for x in ins)} | {beats} of {len(group)} | {error:.3g} | "
                     f"{sum(c['trend']['covered'] for c in group)} of {len(group)} |")
    return lines


def summary_lines(scored: list[dict], claims: int) -> list[str]:
    """The scores without a unit (Brier, decision accuracy), over every predicted clause, and
    plain words on what they support."""
    predicted = [c for c in scored if "trend" in c]
    not_predicted = len(scored) - len(predicted)
    lines = []
    briers = {f: [c[f]["brier"] for c in predicted if c[f]["brier"] is not None] for f in FORECASTS}
    if briers["trend"]:
        lines.append("Brier score of the predicted probability of rejection (lower is better; mean over "
                     f"{len(briers['trend'])} clauses): " + ", ".join(f"{f} {np.mean(b):.3f}" for f, b in briers.items() if b)
                     + ".")
    for f in ("trend", "persistence"):
        d = decision_accuracy(predicted, f)
        ci = f" (95% Clopper-Pearson [{d['low']:.2f}, {d['high']:.2f}])" if d["of"] else ""
        lines.append(f"Decision accuracy of the {f} (DataDecide: the small-scale pick of the arm with the larger "
                     f"value is the held-out rung's): {d['right']} of {d['of']}{ci}; ties, not scored: {d['ties']}.")
    if not_predicted:
        lines.append(f"Not predicted: {not_predicted} clause(s), for the reason the table gives.")
    lines += ["", "What this supports: whether a straight line in log parameters through the fitted rungs forecast "
              "the next width up better than its two baselines, clause by clause, in each clause's unit (a trend "
              "whose CRPS and interval score do not beat persistence's adds nothing to reading the top fitted rung).",
              f"What it does not: one held-out width above the fitted ones says nothing about a model far larger "
              f"(ANDREA-120M); the {len(predicted)} clauses come from {claims} claim(s), and clauses of one claim "
              "share their cells, so the decision accuracy's interval, which treats them as independent, is too "
              "narrow; a forecast assumes one per-seed noise at every width and a line in log parameters."]
    return lines


def _took(ladder: dict) -> str:
    seconds = ladder.get("seconds")
    return "its training time not recorded" if seconds is None else f"trained in {seconds / 60:.1f} min"


def backtest_markdown(ladders: list[dict]) -> str:
    alpha = ladders[0]["alpha"] if ladders else ONE_SIDED_ALPHA
    scored = [c for lad in ladders for c in lad["clauses"]]
    lines = ["# Backtest: the held-out rung predicted under a frozen plan", "",
             *[f"- {lad['claim']}: fitted {', '.join(lad['fitted'])}; held out {lad['held_out']} ({_took(lad)}); plan: claim "
               f"{_short(lad['plan']['claim_sha256'])}, grid {_short(lad['plan']['grid_sha256'])}, analysis "
               f"{_short(lad['plan']['analysis_sha256'])}, commit {lad['plan']['commit'] or 'none (not a git checkout)'}, "
               f"ablate {lad['plan']['version']}" for lad in ladders], "",
             f"Per clause, its first comparison's a - b; the seed is the unit. Forecast: the trend's {1 - 2 * alpha:.0%} "
             "prediction interval for what the held-out rung measures. Scores: trend / persistence (the top fitted "
             "rung's effect) / no change (0), lower is better, in the clause's unit. Rejection: the held-out rung's "
             f"one-sided t over seeds at {alpha:g} (measured) and each forecast's probability of it.", "",
             "| claim | clause | unit | held out | trend forecast [interval] | measured ± se | z | CRPS | "
             "interval score | rejected | P(reject) |", "|---|---|---|---|---|---|---:|---|---|---|---|"]
    lines += [clause_line(lad, c) for lad in ladders for c in lad["clauses"]]
    lines += ["", "Per unit (errors are never pooled across units):", "", *unit_summary(scored), "",
              *summary_lines(scored, len(ladders))]
    return "\n".join(lines) + "\n"


def write_backtest(ladders: list[dict], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = backtest_markdown(ladders)
    replace_atomic(path, lambda f: f.write(text.encode()), fsync=False)
    return path
