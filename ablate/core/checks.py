"""Range checks an option declares (ablate/engine/config.py, or a component's own ComponentOption):
each returns what is valid, or None when the value is fine. Standard library only, so that a
component in ablate.variants declares its options without importing the engine."""
from __future__ import annotations


def at_least(n):
    return lambda v: None if v >= n else f"must be at least {n}"


def within(low, high):
    """At least `low` and at most `high`: a ceiling past any real run, so a larger value is a typo."""
    return lambda v: (f"must be at least {low}" if v < low else
                      None if v <= high else f"must be at most {high}; valid: {low}..{high}")


def positive(v):
    return None if v > 0 else "must be positive"


def non_negative(v):
    return None if v >= 0 else "must be 0 or more"


def unit(v):
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def beta(v):
    return None if 0 <= v < 1 else "must be in [0, 1)"


def above_one(v):
    return None if v > 1 else "must be above 1"
