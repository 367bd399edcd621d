"""The opt-in early stop of a dead run (`stop_dead = N`): a run dead on every logged step for N
steps stops there, evaluates, and finishes as a completed run whose summary names the step
(`stopped_dead_at_step`). A dead run's lower blocks no longer learn (issue 52: 10-17 decades
under Adam's eps against the top's), so it ends on the plateau, and the outcome rule
(ablate/core/collapse.py, read by analysis/outcomes.py) calls it dead from the same rows. What
it saves is the rest of its steps.

Replayed over prenorm-wins' 144 decided cells (300 steps each), N = 20 stops 35 runs and saves
7,337 of 41,734 steps (18%): 33 ended dead, one ended slow (its gradients came back) and one
diverged later. Every one of the 35 failed, so a measure of failure (`failed`, the largest
stable rate) reads the same; the failure's kind (`dead`, `diverged`) differs in 2 of 35, so a
claim read by those should not stop early.

Where the run logs the stability probes, the dead stretch must include a probe step, and every
probe step in it must confirm the collapse, so the last probes the outcome reads agree too.
The watch's state (where the dead stretch began, whether a probe confirmed it) is checkpointed
with the run, so an interrupted run stops at the same step as one that was not.
"""
from __future__ import annotations

from dataclasses import dataclass

from ablate.core.collapse import read_row
from ablate.core.errors import ConfigError


WATCH_KEYS = ("dead_since", "dead_confirmed")  # the watch's state in a checkpoint


@dataclass
class DeadWatch:
    after: int  # stop_dead: the steps a run must have been dead for
    unigram_entropy: float
    probed: bool  # whether the run logs the stability probes, which must then confirm
    since: int | None = None  # the first step of the current dead stretch
    confirmed: bool = False  # a probe step in the stretch confirmed the collapse

    def stops(self, step: int, row: dict) -> bool:
        """Whether the run stops after `step`, whose metrics are `row` (loss and probes): rows
        without per-layer gradient norms (steps not logged) leave the watch as it was."""
        # No context: the probes' evidence the outcome reads (analysis/metrics.py calls
        # failure_kind without one), the representations' test alone.
        read = read_row(row, self.unigram_entropy, None)
        if read is None:
            return False
        dead, probes = read
        if not dead:
            self.since, self.confirmed = None, False
            return False
        if self.since is None:
            self.since, self.confirmed = step, False
        self.confirmed = self.confirmed or bool(probes)
        return step - self.since >= self.after and (self.confirmed or not self.probed)

    def state(self) -> dict:
        return dict(zip(WATCH_KEYS, (self.since, self.confirmed)))

    def restore(self, saved: dict) -> None:
        since, confirmed = (saved.get(k) for k in WATCH_KEYS)
        self.since, self.confirmed = since, bool(confirmed)


def dead_watch(cfg, unigram_entropy) -> DeadWatch | None:
    """The run's watch, or None when it does not stop dead runs. The rule needs the plateau's
    loss, the unigram entropy of the data: data without one recorded cannot use it."""
    if not cfg.stop_dead:
        return None
    if unigram_entropy is None:
        raise ConfigError(f"stop_dead {cfg.stop_dead} needs the data's unigram entropy (the plateau's loss), which this "
                          "data does not record; valid: stop_dead 0, or the default data")
    return DeadWatch(cfg.stop_dead, float(unigram_entropy), probed=cfg.probes and not cfg.compile)
