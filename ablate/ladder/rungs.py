"""A ladder of model sizes for one claim (or a two-arm grid): each rung is the claim's own grid
at another width, as an ordinary grid run in its own folder (resumable, deduplicated, on any
backend). `ablate ladder` (ablate/ladder/run.py) runs the rungs in order and hands the
folders to ablate/ladder/report.py for the effects across sizes.

What scales: the width (d_model) at the claim's depth, with the head dimension fixed (heads
grow with the width, as in GPT-2's family). Depth stays the claim's because several claims are
about depth (post-norm's early layers, the residual path through 12 blocks).

The rate transfer: Adam's best rate for the hidden matrices falls about as 1 / width (Yang et
al. 2022, muP; Everett et al. 2024 for standard parametrisation), so every learning rate of the
claim's grid (its axis, its base, its includes, and the clauses' `at` rates with them) is
multiplied by ref_width / width, where ref_width is the grid's own width. Where a claim picks
each arm's best rate and a rung's best rate for an arm lay at an end of its sweep, the next
rung's sweep moves one step of the sweep that way (and only then), so the sweep follows the
best rate up the ladder instead of leaving it outside.
"""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ablate
import ablate.analysis
from ablate.core.bounded_read import UnreadableFile, read_toml
from ablate.core.errors import ConfigError

# The claims' own width (64) on top, two halvings below: one claim's ladder fits 45 minutes on 2
# cores (a width-128 rung alone took 41 min for swiglu's 18 cells); wider with --widths.
CPU_WIDTHS = (16, 32, 64)
MAX_RUNGS = 16  # --widths: rungs of one ladder (each is a grid of its own); more is a typo
MIN_RUNGS = 3
# --full: the GPU scale's model at half width, itself, and ANDREA-120M at the top.
FULL_RUNGS = ({"width": 192}, {}, {"model": "andrea-120m"})
TARGET_MODEL = "andrea-120m"  # where every ladder's trend is extrapolated to
# What one ladder may plan, stated once; above it the ladder is refused before anything is built:
# a rung of at most this many non-embedding parameters (about ten times ANDREA-120M's, the
# ladder's top with --full) and an estimated time of at most a week (CPU wall time, or with
# --full GPU-hours), whatever the machine.
MAX_RUNG_PARAMS = 10 ** 9
MAX_PLANNED_HOURS = 7 * 24


@dataclass(frozen=True)
class Rung:
    name: str  # its folder: w32, w64, ...
    options: dict  # set in every cell of the rung (width, model)
    width: int
    rate_factor: float  # every learning rate of the claim's grid is multiplied by it
    rates: dict = field(default_factory=dict)  # the grid's rate -> this rung's


def sig3(value: float) -> float:
    """A rate as the grid writes it: three significant digits."""
    return float(f"{value:.3g}")


def rungs_for(widths: list[int], ref_width: int, full: bool = False, full_width: int | None = None) -> list[Rung]:
    """The rungs (without their rates yet), smallest first."""
    if full:
        top = full_width or 768
        # The width set in every cell, the model's own too: a grid's base may name the claim's width.
        full_widths = [o.get("width") or (top if o.get("model") else ref_width) for o in FULL_RUNGS]
        specs = [({**o, "width": w}, w) for o, w in zip(FULL_RUNGS, full_widths)]
    else:
        specs = [({"width": w}, w) for w in widths]
    if len(specs) < MIN_RUNGS:
        raise ConfigError(f"--widths {','.join(str(w) for w in widths)}: a ladder needs at least {MIN_RUNGS} "
                          f"rungs; valid: e.g. {','.join(str(w) for w in CPU_WIDTHS)}")
    if len({w for _, w in specs}) < len(specs):
        raise ConfigError(f"--widths {','.join(str(w) for w in widths)}: a width appears twice; valid: distinct widths")
    specs.sort(key=lambda s: s[1])
    return [Rung(f"w{w}", opts, w, ref_width / w) for opts, w in specs]


def parse_widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--widths {text!r} is not a list of integers; valid: e.g. 16,32,64") from None
    if any(w < 1 for w in widths):
        raise ConfigError(f"--widths {text!r}: every width must be positive; valid: e.g. 16,32,64")
    return widths


def check_widths(text: str, widths: list[int], size) -> None:
    """Refuse --widths the claim's model size (`size`, an ablate.engine.sizes.ModelSize) cannot take: a
    width that is not a multiple of its head dimension, or one whose attention matrices alone
    (4 x width^2 a block) already pass MAX_RUNG_PARAMS, checked before any model is built (a
    width of 2^31 overflows even a model on the meta device)."""
    unit, blocks = size.head_dim, size.n_layer
    widest = int((MAX_RUNG_PARAMS / (4 * blocks)) ** 0.5) // unit * unit
    for w in widths:
        if w % unit:
            raise ConfigError(f"--widths {text}: width {w} is not a multiple of the head dimension {unit} of model "
                              f"{size.name}; valid: {', '.join(str(unit * k) for k in (1, 2, 4, 8))}, ... up to {widest}")
        if 4 * w * w * blocks > MAX_RUNG_PARAMS:
            raise ConfigError(f"--widths {text}: width {w} plans a rung of more than {MAX_RUNG_PARAMS:,} non-embedding "
                              f"parameters at {blocks} blocks (the ladder's ceiling); valid: widths up to {widest}")


def check_sizes(text: str, rungs: list[Rung], sizes: list[int]) -> None:
    """Refuse a rung whose counted parameters pass MAX_RUNG_PARAMS."""
    for rung, n in zip(rungs, sizes):
        if n > MAX_RUNG_PARAMS:
            raise ConfigError(f"--widths {text}: rung {rung.name} has {n:,} non-embedding parameters, more than the "
                              f"ladder's ceiling of {MAX_RUNG_PARAMS:,}; valid: narrower widths")


def check_planned_hours(name: str, hours: float, what: str) -> None:
    """Refuse a ladder whose estimated time passes MAX_PLANNED_HOURS (`what`: its unit)."""
    if hours > MAX_PLANNED_HOURS:
        raise ConfigError(f"ladder {name}: estimated {hours:,.0f} {what}, more than the ceiling of "
                          f"{MAX_PLANNED_HOURS} {what} a ladder may plan; valid: narrower --widths or fewer cells")


# ------------------------------------------------------------------------------ the grid


def grid_rates(data: dict) -> list[float]:
    """Every learning rate a grid file names (any `lr` key, anywhere), sorted."""
    found: set[float] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "lr":
                    found.update(float(v) for v in (value if isinstance(value, list) else [value]))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return sorted(found)


def scaled(data: Any, rates: dict[float, float]) -> Any:
    """The grid file's data with every learning rate replaced as `rates` maps it."""
    if isinstance(data, dict):
        return {k: ([rates[float(x)] for x in v] if isinstance(v, list) else rates[float(v)]) if k == "lr"
                else scaled(v, rates) for k, v in data.items()}
    if isinstance(data, list):
        return [scaled(x, rates) for x in data]
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ConfigError(f"cannot write {value!r} to a grid file")


def toml_text(data: dict, header: str) -> str:
    """A grid file's data as TOML (the shapes grid files use: scalars, lists, tables of them,
    arrays of tables, and [scales.NAME] tables of those)."""
    lines = [f"# {line}" for line in header.splitlines()]
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) or
               (isinstance(v, list) and not any(isinstance(x, dict) for x in v))}
    lines += [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    for key, value in data.items():
        if key in scalars:
            continue
        if isinstance(value, dict) and key == "scales":
            for scale, table in value.items():
                lines += ["", f"[scales.{scale}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        elif isinstance(value, dict):
            lines += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in value.items()]
        else:
            for entry in value:
                lines += ["", f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def read_grid_data(path: Path) -> dict:
    try:  # bounded: a FIFO, a device, a huge or deeply nested file is refused in one line
        data = read_toml(path)
    except UnreadableFile as e:
        raise ConfigError(f"{path}: cannot read as a grid file: {e.why}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read as a grid file: {e}") from None
    # A plugin file is named relative to its grid: the rung's grid lives elsewhere.
    if isinstance(data.get("imports"), list):
        data["imports"] = [str((Path(path).resolve().parent / i).resolve()) for i in data["imports"]]
    return data


def without_own_widths(data: dict) -> dict:
    """The grid file's data less its [[include]] entries that set a width (at any scale): a
    rung sets every cell's width, so such cells (mlp-ratio's equal-parameter ones) would only
    repeat others; the claim's reports that read them are left out of the rung too
    (analysis.claims.claim_at_rung)."""
    def without(table: dict) -> dict:
        entries = table.get("include")
        if not isinstance(entries, list):
            return table
        return {**table, "include": [e for e in entries if not (isinstance(e, dict) and "width" in e)]}

    out = without(data)
    if isinstance(out.get("scales"), dict):
        out["scales"] = {name: without(t) if isinstance(t, dict) else t for name, t in out["scales"].items()}
    return out


def rung_grid_text(data: dict, rung: Rung, source: Path) -> str:
    rung_data = scaled(without_own_widths(data), rung.rates)
    rung_data["name"] = f"{data.get('name', source.stem)}-{rung.name}"
    header = (f"Rung {rung.name} of a ladder over {source}: every learning rate x {rung.rate_factor:.4g} "
              f"(ablate/ladder/rungs.py's transfer rule); set in every cell: {rung.options or 'nothing'}.\n"
              "Written by `ablate ladder`; do not edit.")
    return toml_text(rung_data, header)


def with_rates(rung: Rung, grid_lrs: list[float], shift: float = 1.0) -> Rung:
    factor = rung.rate_factor * shift
    return replace(rung, rate_factor=factor, rates={lr: sig3(lr * factor) for lr in grid_lrs})


def sweep_step(rates: list[float]) -> float:
    """The ratio between neighbouring rates of the sweep (their geometric median)."""
    ratios = [b / a for a, b in zip(rates, rates[1:]) if a > 0]
    return statistics.median(ratios) if ratios else 1.0


def shift_toward_edges(picks: list[tuple[float, float, float]], step: float) -> float:
    """One sweep step up when some arm's best rate was the sweep's top (and none its bottom),
    one step down in the mirror case, else none. `picks`: (best rate, lowest, highest)."""
    top = any(lr >= hi for lr, _, hi in picks)
    bottom = any(lr <= lo for lr, lo, _ in picks)
    if top and not bottom:
        return step
    if bottom and not top:
        return 1.0 / step
    return 1.0


# ------------------------------------------------------------------------------ the claim


def two_arm_claim(grid, source: str):
    """For a plain grid: one clause, the final validation loss of its two arms (the one axis
    besides lr and seed with two values), each at its best rate when lr is swept."""
    from ablate.claims.claim_file import parse_claim  # lazy: keeps numpy, pandas, scipy off `ablate ladder --help`

    arms = [(k, v) for k, v in grid.axes.items() if k not in ("lr", "seed") and len(v) == 2]
    others = [k for k, v in grid.axes.items() if k not in ("lr", "seed") and len(v) > 1 and (k, v) not in arms]
    if len(arms) != 1 or others:
        axes = ", ".join(f"{k} ({len(v)} values)" for k, v in grid.axes.items()) or "none"
        raise ConfigError(f"grid {source}: a ladder needs two arms, one axis besides lr and seed with two values "
                          f"and nothing else crossed; its axes: {axes}")
    (axis, (a, b)), = arms
    best = len(grid.axes.get("lr", [])) >= 3
    compare = {"label": f"final val loss, {axis} {a} vs {b}" + (", each at its best lr" if best else ""),
               "measure": "final_val_loss", "a": {axis: a}, "b": {axis: b}, "expect": "lower", "effect": 0.02,
               "best_lr": best}
    return parse_claim({
        "name": grid.name, "statement": f"{axis} = {a} reaches a lower final validation loss than {axis} = {b}.",
        "source": f"grid {source}", "source_figures": "none", "grid": source, "plot": "lr_curve",
        "plot_params": {"split": axis},
        "clause": [{"label": f"{axis} {a} below {b}", "sentence": f"{axis} = {a} trains to a lower loss than {b}.",
                    "why": "final validation loss, paired by seed" + (", each arm at its best rate" if best else ""),
                    "compare": [compare]}]}, where=f"grid {source}")


# --------------------------------------------------------------------- the backtest's frozen plan


def analysis_sources_sha256() -> str:
    """One sha256 over every source that judges a rung (analysis/, ablate/claims/, ablate/ladder/:
    the ladder's rate rule is this file), each named by its folder and file."""
    here = Path(__file__).parent
    folders = (Path(ablate.analysis.__file__).parent, here.parent / "claims", here)
    files = [f for folder in folders for f in sorted(folder.glob("*.py"))]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.parent.name}/{f.name}".encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def plan_identity(claim, grid_file, scale: str, overrides: dict, fitted_widths, held_out_width: int,
                  alpha: float | None = None, seeds: list[int] | None = None) -> dict:
    """What the backtest's predictions are made under, known before any rung runs (the engine's
    side: the code's commit and sources; ablate/ladder/backtest.py compares and freezes it)."""
    # lazy: keeps numpy, pandas, scipy off `ablate ladder --help`
    from ablate.ladder.backtest import RATE_TRANSFER, sha256_file
    from ablate.analysis.stats import ONE_SIDED_ALPHA
    from ablate.core.provenance import git_commit

    return {"claim": claim.name, "claim_sha256": sha256_file(claim.path), "grid_file": str(grid_file),
            "grid_sha256": sha256_file(grid_file), "commit": git_commit(), "version": ablate.__version__,
            "analysis_sha256": analysis_sources_sha256(), "rate_transfer": RATE_TRANSFER, "scale": scale,
            "overrides": {k: str(v) for k, v in sorted(overrides.items())},
            "fitted_widths": sorted(int(w) for w in fitted_widths), "held_out": f"w{held_out_width}",
            "held_out_width": int(held_out_width), "alpha": ONE_SIDED_ALPHA if alpha is None else alpha,
            "seeds": "the grid's own" if seeds is None else [int(s) for s in seeds]}
