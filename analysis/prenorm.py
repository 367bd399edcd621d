"""The verdict of the "pre-norm wins" experiment, from a grid's cell metrics.

For every (learning rate, warmup[, depth]) setting, pre-norm and post-norm are compared
seed by seed (same seed = same initial weights and batches, so seeds pair):

  outcome   "pre-norm wins" / "post-norm wins" when a paired t-test over seeds of the
            final validation-loss difference gives p < alpha after correcting the settings'
            p-values together (stats.DEFAULT_CORRECTION), in the direction of the mean
            difference; also when one placement diverged in every seed and the other in none
            (a run that diverged has no final loss; it lost). "no significant difference"
            otherwise (with the paired seeds that would tell at 80% power), and "not enough
            seeds to tell" with fewer than two paired seeds.
  plateau   a completed cell whose final val loss is within PLATEAU_MARGIN nats of the
            corpus's unigram entropy: it learnt (almost) nothing from context.

Nothing here trains or imports the model; it reads what the grid wrote.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from ablate.analysis.load import Runs
from ablate.analysis.metrics import PLATEAU_MARGIN, plateaued  # noqa: F401 (PLATEAU_MARGIN: part of this API)
from ablate.analysis.stats import (CORRECTION_SHORT, DEFAULT_CORRECTION, VERDICT_VALUE, Interval, adjust_p_values,
                                   bootstrap_ci, paired_p_value, seeds_for_power)

ALPHA = 0.05
PRE, POST = "pre", "post"
SETTING_AXES = ("lr", "warmup", "n_layer")


@dataclass(frozen=True)
class Side:
    """One placement in one setting, across seeds."""

    losses: dict  # seed -> final loss of completed cells
    diverged: tuple  # seeds that diverged
    plateaued: tuple  # completed seeds stuck near the unigram entropy
    interval: Interval | None

    @property
    def mean(self) -> float | None:
        return float(np.mean(list(self.losses.values()))) if self.losses else None

    @property
    def n_trained(self) -> int:
        return len(self.losses) + len(self.diverged)

    def describe(self) -> str:
        if not self.losses:
            text = "no completed seed"
        elif self.interval is None:
            text = f"{self.mean:.3f} (one seed: no interval)"
        else:
            text = f"{self.mean:.3f} [{self.interval.low:.3f}, {self.interval.high:.3f}]"
        return f"{text}; diverged {len(self.diverged)}/{self.n_trained}, plateau {len(self.plateaued)}/{self.n_trained}"


@dataclass(frozen=True)
class SettingVerdict:
    setting: dict
    pre: Side
    post: Side
    diff_mean: float | None  # post - pre, over paired seeds (positive: pre-norm lower)
    diff_interval: Interval | None
    p_value: float | None  # the paired t-test's, before correction
    n_pairs: int
    outcome: str
    reason: str
    p_adjusted: float | None = None  # corrected over the grid's settings

    def label(self) -> str:
        parts = [f"lr {self.setting['lr']:g}", f"warmup {int(self.setting['warmup'])}"]
        if "n_layer" in self.setting:
            parts.append(f"{int(self.setting['n_layer'])} blocks")
        return ", ".join(parts)

    def sentence(self) -> str:
        return f"At {self.label()}: **{self.outcome}** ({self.reason})."


def paired(pre: Side, post: Side) -> tuple[list, np.ndarray, float | None]:
    """Seeds completed under both placements, their differences post - pre, and the paired
    t-test p-value over them (None with fewer than two pairs)."""
    seeds = sorted(set(pre.losses) & set(post.losses))
    post_losses, pre_losses = [post.losses[s] for s in seeds], [pre.losses[s] for s in seeds]
    p = paired_p_value(post_losses, pre_losses) if len(seeds) >= 2 else None
    return seeds, np.subtract(post_losses, pre_losses), p


_UNCORRECTED = object()


def decide(pre: Side, post: Side, alpha: float = ALPHA, p_adjusted=_UNCORRECTED,
           correction: str = DEFAULT_CORRECTION):
    """(outcome, reason, paired differences) for one setting; see the module docstring.
    `p_adjusted`: this setting's p-value after the correction across settings (default:
    none applied, the raw paired p decides)."""
    seeds, diffs, p = paired(pre, post)
    corrected = p_adjusted is not _UNCORRECTED
    decisive = p_adjusted if corrected else p
    if post.diverged and len(post.diverged) == post.n_trained >= 2 and not pre.diverged:
        return "pre-norm wins", f"post-norm diverged in all {post.n_trained} seeds, pre-norm in none", diffs
    if pre.diverged and len(pre.diverged) == pre.n_trained >= 2 and not post.diverged:
        return "post-norm wins", f"pre-norm diverged in all {pre.n_trained} seeds, post-norm in none", diffs
    if len(seeds) < 2:
        return "not enough seeds to tell", f"{len(seeds)} seed(s) completed under both placements; a test needs 2", diffs
    mean = float(diffs.mean())
    stated = f"post - pre = {mean:+.3f} nats over {len(seeds)} paired seeds, paired t-test p={format_p(p)}"
    if corrected:
        stated += f", {CORRECTION_SHORT[correction]}-adjusted p={format_p(decisive)}"
    if decisive is not None and decisive < alpha:
        return ("pre-norm wins" if mean > 0 else "post-norm wins"), stated, diffs
    if p is None and np.allclose(diffs, diffs[0], rtol=0, atol=1e-9) and abs(diffs[0]) > 1e-9:
        # Every seed moved by exactly the same amount: no variance to test, but no doubt either.
        return ("pre-norm wins" if mean > 0 else "post-norm wins"), stated + " (identical differences)", diffs
    needed = seeds_for_power(diffs, alpha)
    if needed is not None:
        stated += f"; about {needed} paired seeds would detect a difference of this size with 80% power"
    return "no significant difference", stated, diffs


def format_p(p: float | None) -> str:
    """The verdict's spelling of a p-value (two significant digits, floor 1e-4)."""
    if p is None:
        return "undefined"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _side(cells: pd.DataFrame, value: str = VERDICT_VALUE) -> Side:
    done = cells[cells["status"] == "completed"]
    losses = {int(seed): float(loss) for seed, loss in zip(done["seed"], done[value]) if math.isfinite(loss)}
    diverged = tuple(sorted(int(s) for s in cells.loc[cells["status"] == "diverged", "seed"]))
    stuck = tuple(sorted(int(seed) for seed, loss, entropy in zip(done["seed"], done[value], done["unigram_entropy"])
                         if plateaued(loss, entropy)))
    return Side(losses, diverged, stuck, bootstrap_ci(list(losses.values())))


def setting_axes(metrics: pd.DataFrame) -> list[str]:
    """lr and warmup always; depth too when the grid sweeps it."""
    axes = ["lr", "warmup"]
    if "n_layer" in metrics and metrics["n_layer"].nunique() > 1:
        axes.append("n_layer")
    return axes


def setting_verdicts(metrics: pd.DataFrame, alpha: float = ALPHA,
                     correction: str = DEFAULT_CORRECTION) -> list[SettingVerdict]:
    """One verdict per setting, from a `cell_metrics` frame with pre and post cells; the
    settings' paired p-values are corrected together (`correction`, stats.CORRECTIONS)."""
    if "unigram_entropy" not in metrics:
        metrics = metrics.assign(unigram_entropy=None)
    axes = setting_axes(metrics)
    sides = []
    for key, cells in metrics.groupby(axes, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        sides.append((dict(zip(axes, key)), _side(cells[cells["norm"] == PRE]), _side(cells[cells["norm"] == POST])))
    raw = [paired(pre, post)[2] for _, pre, post in sides]
    adjusted = adjust_p_values(raw, correction)
    out = []
    for (setting, pre, post), p, p_adjusted in zip(sides, raw, adjusted):
        outcome, reason, diffs = decide(pre, post, alpha, p_adjusted, correction)
        interval = bootstrap_ci(diffs) if diffs.size else None
        out.append(SettingVerdict(setting, pre, post, float(diffs.mean()) if diffs.size else None,
                                  interval, p, int(diffs.size), outcome, reason, p_adjusted))
    return out


def _gap(v: SettingVerdict) -> str:
    if v.diff_mean is None:
        return "no paired seeds"
    ci = f" [{v.diff_interval.low:+.3f}, {v.diff_interval.high:+.3f}]" if v.diff_interval else " (no interval)"
    return f"{v.diff_mean:+.3f}{ci}"


def _closes(before: SettingVerdict, after: SettingVerdict, change: str) -> str:
    """Does the gap (post - pre) close when going from `before` to `after`?"""
    head = f"{change}: the gap (post - pre) goes from {_gap(before)} at {before.label()} to {_gap(after)} at {after.label()}"
    if before.outcome != "pre-norm wins":
        return f"{head}; pre-norm did not win at {before.label()} to begin with, so there is no gap to close."
    if after.outcome == "pre-norm wins":
        if after.diff_mean is not None and before.diff_mean is not None and after.diff_mean < before.diff_mean:
            return f"{head}: it narrows but does not close (pre-norm still wins)."
        return f"{head}: it does not close."
    if after.outcome == "post-norm wins":
        return f"{head}: it closes and reverses (post-norm wins)."
    if after.outcome == "no significant difference":
        return f"{head}: it closes (no significant difference)."
    return f"{head}: cannot tell ({after.outcome})."


def gap_sentences(verdicts: list[SettingVerdict]) -> list[str]:
    """Whether warmup, and a lower learning rate, close the gap seen at (high lr, no warmup)."""
    by = {tuple(sorted(v.setting.items())): v for v in verdicts}
    lrs = sorted({v.setting["lr"] for v in verdicts})
    warmups = sorted({v.setting["warmup"] for v in verdicts})
    depths = sorted({v.setting.get("n_layer") for v in verdicts}, key=lambda d: -1 if d is None else d)
    out = []
    for depth in depths:
        def get(lr, warmup):
            setting = {"lr": lr, "warmup": warmup, **({"n_layer": depth} if depth is not None else {})}
            return by.get(tuple(sorted(setting.items())))

        start = get(lrs[-1], warmups[0])
        if start is None:
            continue
        if len(warmups) > 1 and get(lrs[-1], warmups[-1]):
            out.append(_closes(start, get(lrs[-1], warmups[-1]), f"With warmup ({int(warmups[-1])} steps)"))
        if len(lrs) > 1 and get(lrs[0], warmups[0]):
            out.append(_closes(start, get(lrs[0], warmups[0]), f"With the lower learning rate ({lrs[0]:g})"))
    return out


@dataclass(frozen=True)
class InitProfile:
    placement: str
    values: np.ndarray  # per layer, mean across seeds, at the first logged step
    metric: str

    @property
    def argmax(self) -> int:
        return int(np.argmax(self.values))

    @property
    def ratio(self) -> float:
        return float(self.values.max() / self.values.min())

    @property
    def rho(self) -> float:
        """Spearman correlation of the gradient norm with layer index (+1: grows with depth)."""
        if len(self.values) < 3 or np.all(self.values == self.values[0]):
            return 0.0
        return float(scipy_stats.spearmanr(np.arange(len(self.values)), self.values).statistic)

    def shape(self) -> str:
        if self.ratio < 1.5:
            return "flat"
        if self.rho >= 0.5:
            return "rising with depth"
        if self.rho <= -0.5:
            return "falling with depth"
        return "uneven"

    def sentence(self) -> str:
        n = len(self.values)
        return (f"{self.placement}-norm: largest at layer {self.argmax} of 0..{n - 1}, max/min {self.ratio:.2f}x "
                f"across layers, {self.shape()} (Spearman rho {self.rho:+.2f} with layer index)")


def init_profiles(runs: Runs, cells: pd.DataFrame, metric: str = "mlp") -> list[InitProfile]:
    """Per-layer gradient norm of `metric` parameters (mlp = the FFN, Xiong et al.'s quantity)
    at the first logged step, averaged over the given cells' seeds, per placement."""
    out = []
    for placement in (PRE, POST):
        ids = set(cells.loc[cells["norm"] == placement, "cell_id"])
        first = runs.steps[runs.steps["cell_id"].isin(ids)].sort_values("step").groupby("cell_id").head(1)
        columns = sorted((c for c in first.columns if c.startswith("grad_norm/layer_") and c.endswith(f"/{metric}")),
                         key=lambda c: int(c.split("_")[2].split("/")[0]))
        if first.empty or not columns:
            continue
        out.append(InitProfile(placement, first[columns].to_numpy(dtype=float).mean(axis=0), metric))
    return out


def xiong_sentence(profiles: list[InitProfile]) -> str:
    """Set the measured init profiles against Xiong et al. (2020): post-LN's FFN gradient
    norm grows with layer index at initialisation; pre-LN's stays flat."""
    by = {p.placement: p for p in profiles}
    if PRE not in by or POST not in by:
        return "Both placements are needed to compare against Xiong et al. (2020); this grid lacks one."
    pre, post = by[PRE], by[POST]
    post_ok = post.shape() == "rising with depth"
    pre_ok = pre.ratio < post.ratio and pre.shape() in ("flat", "falling with depth", "uneven")
    if post_ok and pre_ok:
        return ("This agrees with Xiong et al. (2020): post-norm's FFN gradients grow with layer index at "
                "initialisation while pre-norm's stay comparatively even.")
    parts = []
    if not post_ok:
        parts.append(f"post-norm's profile is {post.shape()}, not rising with depth as Xiong et al. (2020) predict")
    if not pre_ok:
        parts.append(f"pre-norm's profile (max/min {pre.ratio:.2f}x) is not flatter than post-norm's ({post.ratio:.2f}x)")
    return "This does not match Xiong et al. (2020) as stated: " + "; ".join(parts) + "."
