"""`ablate ladder CLAIM... | GRID | all`: a claim's grid at a ladder of model sizes (ablate/ladder/rungs.py
says what scales and how the learning rates transfer), the clause verdicts per rung, and the
effects across sizes with a trend and its prediction at ANDREA-120M (ablate/ladder/report.py).
`--backtest` adds a held-out rung above the widths (twice the widest), freezes the analysis
plan and every prediction from the fitted rungs before it trains, and scores the predictions
(ablate/ladder/backtest.py). Output: runs/ladders/NAME[-full]/ (a folder per rung, ladder.md,
ladder.json, plots/; with --backtest backtest_plan.json and backtest.md); with several claims,
backtest.md in the root too.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ablate.bench.estimate import grid_speed
from ablate.claims.claim_file import ClaimError, claim_at_rung
from ablate.claims.claim_report import write_claim_report
from ablate.claims.design import own_seeds, seed_sequence
from ablate.claims.plan import ASSUMED_MFU, ASSUMED_PEAK_FLOPS, check_claim_grid, estimate_gpu_hours, quick_seconds
from ablate.claims.run import ALL, shipped_claims
from ablate.core.errors import ConfigError
from ablate.core.rundir import SUMMARY
from ablate.core.safe_files import output_folder, replace_atomic
from ablate.engine.sizes import get_size
from ablate.ladder.backtest import (BACKTEST_MD, BacktestError, PLAN_JSON, check_plan, freeze_plan, score_ladder,
                                    sha256_file, write_backtest)
from ablate.ladder.report import LADDER_JSON, REPORT_MD, RESULT_JSON, load_ladder, write_ladder_report
from ablate.ladder.rungs import (CPU_WIDTHS, TARGET_MODEL, check_planned_hours, check_sizes, check_widths, grid_rates,
                                 plan_identity, read_grid_data, rung_grid_text, rungs_for, shift_toward_edges,
                                 sweep_step, two_arm_claim, with_rates)

DEFAULT_ROOT = Path("runs") / "ladders"
GRIDS_DIR = "grids"


# ------------------------------------------------------------------------------- planning


class LadderPlan:
    """One claim's ladder, checked before anything is written: the grid file's data, the rungs
    (with the rates they would get before any shift), their loaded grids and sizes."""

    def __init__(self, claim, source: Path, scale: str, overrides: dict, widths: list[int], full: bool,
                 imports_policy: str, out: Path, n_seeds: int | None = None):
        from ablate.grid.spec import load_grid  # lazy: torch only when used

        self.claim, self.source, self.scale, self.overrides, self.out = claim, source, scale, overrides, out
        self.imports_policy = imports_policy
        self.data = read_grid_data(source)
        self.lrs = grid_rates(self.data)
        own = load_grid(source, scale, overrides, imports_policy)
        self.seeds = seed_sequence(own_seeds(own), n_seeds) if n_seeds is not None else None  # None: the grid's
        ref = _base_config(own)
        self.ref_width = ref.size.d_model
        self.step = sweep_step(sorted(own.axes.get("lr", [])))
        text = ",".join(str(w) for w in widths)
        if not full:  # before any rung's model is built: a width of 2^31 overflows even on the meta device
            check_widths(text, widths, ref.size)
        self.rungs = [with_rates(r, self.lrs) for r in rungs_for(widths, self.ref_width, full, None)]
        check_ladder_folder(out, self.rungs)
        self.grids = [self.load(r) for r in self.rungs]  # every rung refused now, not half-way
        loaded: dict = {}  # rungs of one size family share their data: read it once
        for rung, grid in zip(self.rungs, self.grids):
            check_data_feeds(rung, _base_config(grid), loaded)
        self.sizes = [nonembedding_params(_base_config(g)) for g in self.grids]
        check_sizes(text, self.rungs, self.sizes)
        self.targets = _targets(ref, self.rungs[-1].width, self.sizes[-1])

    def grid_file(self, rung) -> Path:
        return self.out / GRIDS_DIR / f"{rung.name}.toml"

    def load(self, rung, write: bool = False):
        """The rung's grid, from its grid file (written first when `write`; else a temporary)."""
        from ablate.grid.runner import check_grid  # lazy: torch only when used
        from ablate.grid.spec import load_grid

        text = rung_grid_text(self.data, rung, self.source)
        if write:
            path = self.grid_file(rung)
            output_folder(path.parent)  # a link planted at grids/ is replaced, never written through
            _write_text(path, text)
            grid = load_grid(path, self.scale, {**self.overrides, **rung.options}, self.imports_policy,
                             seeds=self.seeds)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{rung.name}.toml"
                path.write_text(text)
                grid = load_grid(path, self.scale, {**self.overrides, **rung.options}, self.imports_policy,
                                 seeds=self.seeds)
        check_grid(grid, self.out / rung.name)
        try:
            rung_claim = claim_at_rung(self.claim, rung.rates, self.ref_width, rung.width)
        except ClaimError as e:  # a clause that names only other widths: one line, before anything runs
            raise ConfigError(str(e)) from None
        check_claim_grid(rung_claim, grid)
        return grid


def check_ladder_folder(out: Path, rungs) -> None:
    """Refuse, before anything is written, a ladder folder whose parts are damaged: a file where
    the ladder keeps a folder (grids/, plots/, a rung's), a folder where it writes a file (a
    rung's grid file, ladder.json, ladder.md, ladder_result.json), a rung folder that is a link
    (its cells would train elsewhere). A link at grids/ or plots/ is replaced when written."""
    from ablate.analysis.report import PLOTS_DIR  # lazy: matplotlib, seaborn only when used

    folders = [out / GRIDS_DIR, out / PLOTS_DIR, *[out / r.name for r in rungs]]
    files = [out / LADDER_JSON, out / REPORT_MD, out / RESULT_JSON, *[out / GRIDS_DIR / f"{r.name}.toml" for r in rungs]]
    for path in folders:
        if path.is_symlink() and path.parent == out and path.name not in (GRIDS_DIR, PLOTS_DIR):
            raise ConfigError(f"ladder folder {out}: rung folder {path.name} is a symbolic link; valid: a folder "
                              "inside the ladder's (remove the link)")
        if path.exists() and not path.is_symlink() and not path.is_dir():
            raise ConfigError(f"ladder folder {out}: {path.relative_to(out)} is a file where the ladder keeps a "
                              "folder; valid: a folder (move the file away)")
    for path in files:
        if path.is_dir() and not path.is_symlink():
            raise ConfigError(f"ladder folder {out}: {path.relative_to(out)} is a folder where the ladder writes a "
                              "file; valid: a file or nothing there (move the folder away)")


def _base_config(grid):
    """The config of the grid's first cell: its model size is the rung's."""
    return grid.configs.setting(grid.cells[0].id)


def check_data_feeds(rung, cfg, loaded: dict) -> None:
    """Refuse a rung whose model the data cannot feed: a split shorter than one context window,
    or token ids beyond the model's vocabulary. `loaded`: data already read, by its key."""
    from ablate.engine.data import load_data  # lazy: torch only when used

    key = (cfg.data, cfg.size.tokenizer, cfg.size.vocab_size)
    if key not in loaded:
        loaded[key] = load_data(*key)
    data = loaded[key]
    for split, arrays in (("train", data.train), ("val", data.val)):
        if max((a.size for a in arrays), default=0) <= cfg.context:
            raise ConfigError(f"rung {rung.name} ({cfg.model}, context {cfg.context}): the data's {split} split "
                              f"({sum(a.size for a in arrays):,} tokens) is shorter than one context window; valid: "
                              "more data, or --set seq_len=N below it")
    if data.max_token is not None and data.max_token >= cfg.size.vocab_size:
        raise ConfigError(f"rung {rung.name} ({cfg.model}): the data's token id {data.max_token} is outside its "
                          f"vocabulary of {cfg.size.vocab_size}; valid: a size with a larger vocab_size")


def nonembedding_params(cfg) -> int:
    """Parameters but the token and position embeddings (Kaplan et al. 2020's N)."""
    from ablate.engine.model import build_model  # lazy: torch only when used

    model = build_model(cfg.spec, cfg.size, device="meta")
    return sum(p.numel() for n, p in model.named_parameters() if n not in ("wte.weight", "wpe.weight"))


def _targets(ref_cfg, top_width: int, top_size: int) -> dict:
    """The sizes the trend is extrapolated to: one rung up (twice the top width) and ANDREA-120M,
    with the claim's block."""
    up = replace(ref_cfg, width=top_width * 2, model=ref_cfg.model)
    andrea = replace(ref_cfg, model=TARGET_MODEL, width=None, layers=None)
    return {f"w{top_width * 2}": nonembedding_params(up), TARGET_MODEL: nonembedding_params(andrea),
            "_andrea_layers": get_size(TARGET_MODEL).n_layer}


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomic(path, lambda f: f.write(text.encode()))


# -------------------------------------------------------------------------------- running


def estimate(plan: LadderPlan, workers: int, full: bool) -> list[str]:
    """The plan's rungs and estimated time, as printed; refused (ablate.ladder.rungs.check_planned_hours)
    when the time passes the ladder's ceiling."""
    lines, total, span, source = [], 0.0, lambda seconds: "", ""
    for rung, grid, size in zip(plan.rungs, plan.grids, plan.sizes):
        if full:
            hours = estimate_gpu_hours(grid)
            total += hours
            cost = f"{hours:.2f} GPU-hours at least"
        else:
            speed = grid_speed(grid, workers)
            span, source = speed.span, speed.source()  # the same for every rung
            seconds = quick_seconds(grid, max(1, workers), speed)
            total += seconds
            cost = f"about {seconds / 60:.1f} min"
        rates = ", ".join(f"{r:g}" for r in sorted({grid.configs.setting(c.id).lr for c in grid.cells}))
        lines.append(f"  {rung.name:<6} width {rung.width:<5} {size:>11,} params (non-embedding)  lr x "
                     f"{rung.rate_factor:.3g}: {rates}  {len(grid.cells)} cells  {cost}")
    check_planned_hours(plan.claim.name, total if full else total / 3600, "GPU-hours" if full else "hours")
    if full:
        what = (f"{total:.2f} GPU-hours at least, at {ASSUMED_MFU:.0%} of a {ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s "
                "bf16 GPU (small models reach less, so expect more)")
    else:
        what = f"about {total / 60:.1f} min{span(total)} with {max(1, workers)} cells at once, from {source}"
    lines.append(f"  total: {what}; before any move of a rung's sweep")
    return lines


def run_ladder(plan: LadderPlan, options, quiet: bool, before_rung=None) -> tuple[int, dict]:
    """Run the rungs smallest first, each rung's sweep placed from the rung below's verdict; then
    the ladder's report. `before_rung(rung, grid, size)`, if given, is called once a rung's grid file
    is written and before it trains. Returns (worst exit status, the ladder's summary)."""
    from ablate.grid.runner import run_grid  # lazy: torch only when used

    worst, shift, record = 0, 1.0, []
    earlier = _recorded_seconds(plan.out)
    for base_rung, size in zip(plan.rungs, plan.sizes):
        rung = with_rates(base_rung, plan.lrs, shift)
        grid = plan.load(rung, write=True)
        folder = plan.out / rung.name
        print(f"{plan.claim.name} rung {rung.name}: width {rung.width}, lr x {rung.rate_factor:.3g}, "
              f"{len(grid.cells)} cells -> {folder}", flush=True)
        finished_before = sum((folder / c.id / SUMMARY).exists() for c in grid.cells)
        if before_rung is not None:
            before_rung(rung, grid, size)
        t0 = time.time()
        status = run_grid(grid, folder, options)
        # A rung that had nothing left to train keeps the time recorded when it trained (a rung
        # resumed after a stop records the resumed part).
        seconds = earlier.get(rung.name) if finished_before == len(grid.cells) else round(time.time() - t0, 1)
        worst = max(worst, status)
        if status == 2:
            return status, {}
        pending = [c.id for c in grid.cells if not (folder / c.id / SUMMARY).exists()]
        if pending:  # submitted and not waited for (--no-wait), or cells that could not run
            print(f"  {rung.name}: {len(pending)} of {len(grid.cells)} cells not finished; the next rung's sweep is "
                  "placed from this one's results, so the ladder stops here: rerun it to follow up", flush=True)
            return max(worst, 1), {}
        rung_claim = claim_at_rung(plan.claim, rung.rates, plan.ref_width, rung.width)
        _, verdict = write_claim_report(rung_claim, folder, listed_only=True)
        print(f"  {rung.name}: {verdict.text()}", flush=True)
        record.append({"name": rung.name, "options": rung.options, "width": rung.width,
                       "rate_factor": rung.rate_factor, "rates": {f"{k:g}": v for k, v in rung.rates.items()},
                       "size": size, "folder": rung.name, "grid_file": str(plan.grid_file(rung).relative_to(plan.out)),
                       "seconds": seconds})
        shift *= shift_toward_edges(_best_picks(verdict, grid), plan.step)
        _write_ladder_json(plan, record)  # after every rung: a stopped ladder keeps its rungs' times
    summary = write_ladder_report(plan.claim, plan.out)
    return worst, summary


def _write_ladder_json(plan: LadderPlan, record: list[dict]) -> None:
    ladder = {"claim": plan.claim.name, "source": str(plan.source), "scale": plan.scale,
              "ref_width": plan.ref_width, "rungs": record, "targets": plan.targets,
              "seconds": _total_seconds(record)}
    _write_text(plan.out / LADDER_JSON, json.dumps(ladder, indent=2) + "\n")


def _total_seconds(record: list[dict]) -> float | None:
    """The rungs' seconds summed; None when a rung's time is not known (trained by a version
    that did not record it)."""
    times = [r["seconds"] for r in record]
    return None if any(t is None for t in times) else round(sum(times), 1)


def _recorded_seconds(out: Path) -> dict[str, float]:
    """rung name -> the seconds its run took, as an earlier run of this ladder recorded them."""
    try:
        return {r["name"]: r["seconds"] for r in load_ladder(out)["rungs"] if r.get("seconds") is not None}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _best_picks(verdict, grid) -> list[tuple[float, float, float]]:
    rates = sorted(grid.axes.get("lr", []))
    if not rates:
        return []
    return [(lr, rates[0], rates[-1]) for r in [*verdict.results, *verdict.reported] if r.compare.best_lr
            for picks in r.best.values() for _, lr, _ in picks]


# ------------------------------------------------------------------------------ the command


def _claims_and_sources(names: list[str], imports_policy: str):
    """[(claim, grid file)] for claim names, `all`, or one grid file (a two-arm claim made for it)."""
    from ablate.grid.spec import find_grid, load_grid  # lazy: torch only when used

    claims = shipped_claims()
    if names == [ALL]:
        return [(c, find_grid(c.grid)) for c in claims.values()]
    out = []
    for name in names:
        if name in claims:
            out.append((claims[name], find_grid(claims[name].grid)))
        elif name.endswith(".toml") or Path(name).is_file():
            path = find_grid(name)
            out.append((two_arm_claim(load_grid(path, imports_policy=imports_policy), str(path)), path))
        else:
            raise ConfigError(f"unknown claim {name!r}; valid: {', '.join([*claims, ALL])}, or a grid file with two arms")
    return out


@dataclasses.dataclass(frozen=True)
class LadderRequest:
    """What `ablate ladder` was asked, every value checked: the claims (or a grid file), the rungs'
    widths, the scale, the seeds, the overrides and how cells run."""

    names: list
    widths: list
    full: bool
    backtest: bool
    n_seeds: int | None
    overrides: dict
    options: object  # ablate.grid.runner.GridRunOptions
    workers: int  # the estimate's cells at once
    root: Path
    imports_policy: str
    dry_run: bool = False
    quiet: bool = False


def run_ladders(req: LadderRequest) -> int:
    """Plan every claim's ladder (all checked before any is printed), then run each, and with
    --backtest freeze the plan and score the held-out rung. Returns the exit status."""
    widths, held_out = req.widths, (_held_out_width(req.widths, req.full) if req.backtest else None)
    scale = "gpu" if req.full else "cpu"
    pairs = _claims_and_sources(req.names, req.imports_policy)
    suffix = "-full" if req.full else ""
    plans = [LadderPlan(claim, source, scale, req.overrides, widths + ([held_out] if held_out else []), req.full,
                        req.imports_policy, req.root / f"{claim.name}{suffix}", req.n_seeds)
             for claim, source in pairs]  # all checked first
    identities = {plan.claim.name: _backtest_identity(plan, widths, held_out) for plan in plans} if held_out else {}
    estimates = [estimate(plan, req.workers, req.full) for plan in plans]  # every one refused before any is printed
    for plan, lines in zip(plans, estimates):
        print(f"{plan.claim.name}: ladder of {len(plan.rungs)} rungs -> {plan.out}")
        print("\n".join(lines), flush=True)
        if held_out:
            print(f"  held out: w{held_out}, predicted from {', '.join(f'w{w}' for w in sorted(widths))} under the plan "
                  "frozen before it trains", flush=True)
    if req.dry_run:
        return 0
    worst, summaries = 0, []
    for plan in plans:
        hook = _freezer(plan, identities[plan.claim.name]) if held_out else None
        status, summary = run_ladder(plan, req.options, req.quiet, hook)
        worst = max(worst, status)
        if summary:
            summaries.append(summary)
            print(f"{plan.claim.name}: {summary['sentence_count']} clause(s); report: {plan.out / 'ladder.md'}")
            for line in [*summary["sentences"], *(f"note: {n}" for n in summary.get("notes", []))]:
                print(f"  {line}", flush=True)
    unfinished = [plan.claim.name for plan in plans if not any(s["claim"] == plan.claim.name for s in summaries)]
    if held_out and unfinished:  # a backtest of some ladders would read as one of all

        print(f"ablate ladder: --backtest not scored: ladder(s) {', '.join(unfinished)} did not finish; valid: rerun "
              "the ladder until every rung has finished", file=sys.stderr)
        return max(worst, 1)
    if held_out and summaries:
        _score(plans, identities, {s["claim"] for s in summaries}, root / f"backtest{suffix}.md")
    return worst


# ------------------------------------------------------------------------------ the backtest


def _held_out_width(widths: list[int], full: bool) -> int:
    """The backtest's held-out rung: twice the widest fitted width, above every rung it is
    predicted from (and above the claims' own width, where their grids were developed)."""
    if full:
        raise ConfigError("--backtest with --full: the GPU ladder's 3 rungs leave none to hold out above 3 fitted "
                          f"ones; valid: --backtest on the CPU ladder (--widths, e.g. {','.join(map(str, CPU_WIDTHS))})")
    rungs_for(widths, 1)  # the fitted rungs alone: at least 3, distinct
    return 2 * max(widths)


def _backtest_identity(plan: LadderPlan, widths: list[int], held_out: int) -> dict:
    """The plan the predictions are made under; a ladder frozen under another is refused now."""
    identity = plan_identity(plan.claim, plan.source, plan.scale, plan.overrides, widths, held_out, seeds=plan.seeds)
    started = any((plan.out / identity["held_out"]).glob(f"*/{SUMMARY}"))
    with _refused():
        check_plan(plan.out, identity, started)
    return identity


@contextmanager
def _refused():
    """A plan or held-out rung the backtest refuses: one line, exit 2 (ConfigError)."""
    try:
        yield
    except BacktestError as e:
        raise ConfigError(str(e)) from None


def _freezer(plan: LadderPlan, identity: dict):
    """The hook that freezes the plan and its predictions just before the held-out rung trains."""
    def before(rung, grid, size: int) -> None:
        if rung.name == identity["held_out"]:
            held = {"grid_sha256": sha256_file(plan.grid_file(rung)), "size": size,
                    "seeds": len(own_seeds(grid)),
                    "rates": {f"{k:g}": v for k, v in rung.rates.items()}}
            with _refused():
                freeze_plan(plan.claim, plan.out, identity, held, load_ladder(plan.out))
            print(f"  plan frozen: {plan.out / PLAN_JSON}", flush=True)
    return before


def _score(plans: list[LadderPlan], identities: dict, done: set, combined: Path) -> None:
    with _refused():
        scored = [score_ladder(p.claim, p.out, identities[p.claim.name]) for p in plans if p.claim.name in done]
    for p, ladder in zip([p for p in plans if p.claim.name in done], scored):
        print(f"backtest: {write_backtest([ladder], p.out / BACKTEST_MD)}")
    if len(scored) > 1:
        print(f"backtest of {len(scored)} ladders: {write_backtest(scored, combined)}")
