"""A claim run's options, checked as the command line gives them: `--seeds`, `--budget`,
`--looks`, and the exit status of a run that stops before deciding. Standard library only, so
that `ablate reproduce --help` and `ablate ladder --help` import nothing heavy."""
from __future__ import annotations

import re

from ablate.core.counts import shown
from ablate.core.errors import ConfigError

MIN_SEEDS = 2  # fewer leaves no spread over seeds: no test at all
MAX_SEEDS = 10_000  # `--seeds` of reproduce and ladder: far past any design; a larger number is a typo
MAX_BUDGET_HOURS = 24 * 7 * 4  # `--budget`: four weeks of wall time
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
UNDECIDED = 3  # exit status of a run that stopped before deciding (never 0: a script tells them apart)


def parse_seeds(text: str | None) -> int | None:
    """`--seeds N`: a whole number of seeds, at least MIN_SEEDS; ConfigError otherwise."""
    if text is None:
        return None
    try:
        n = int(str(text).strip())
    except ValueError:
        n = None
    if n is None or not MIN_SEEDS <= n <= MAX_SEEDS:  # refused before any list of seeds is built
        raise ConfigError(f"--seeds {shown(text)} is not a number of seeds; valid: a whole number in "
                          f"{MIN_SEEDS}..{MAX_SEEDS}")
    return n


def parse_budget(text: str | None) -> float | None:
    """`--budget 30m` (also 90s, 1h, 1.5h) in seconds; ConfigError otherwise."""
    if text is None:
        return None
    found = _DURATION.match(str(text))
    seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else 0.0
    if not 0 < seconds <= MAX_BUDGET_HOURS * 3600:  # a 400-digit number reads as inf: refused too
        raise ConfigError(f"--budget {shown(text)} is not a duration; valid: a positive number with a unit s, m or "
                          f"h, up to {MAX_BUDGET_HOURS}h, e.g. 90s, 30m, 1.5h")
    return seconds


def check_seeds_override(overrides: dict, flag: str) -> None:
    """A design of several seeds and `--set seed=S` contradict each other."""
    if "seed" in overrides:
        raise ConfigError(f"--set seed={overrides['seed']} and {flag} contradict each other; valid: one of them")


def parse_looks(text: str | None) -> tuple | None:
    """`--looks 3,6,12,24`: the seeds at each look, whole numbers rising; ConfigError otherwise."""
    if text is None:
        return None
    try:
        looks = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        looks = ()
    if not looks or looks[0] < 1 or any(b <= a for a, b in zip(looks, looks[1:])) or looks[-1] > 10_000:
        raise ConfigError(f"--looks {shown(text)} is not a plan of looks; valid: seeds at each look, whole numbers rising "
                          "from 1 to at most 10,000, comma-separated, e.g. 3,6,12,24")
    return looks
