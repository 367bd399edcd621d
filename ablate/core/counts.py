"""The counts a user gives on the command line: an argparse `type=` that refuses a number past
its option's ceiling (declared beside the option) in one line, exit 2, before anything is built
or allocated; and how a refusal shows a value (a 400-digit number, elided). The lower bound of
each option stays checked where it was (GridRunOptions, the commands), with its own words.
Standard library only: parsers import it before any command runs."""
from __future__ import annotations

import argparse
import math

SHOWN_CHARACTERS = 40  # a refused value longer than this is shown by its ends and its length


def shown(text, quote: bool = True) -> str:
    """`text` as a refusal shows it: its repr (or as it is, `quote` False), the middle elided past
    SHOWN_CHARACTERS."""
    quoted = repr(str(text)) if quote else str(text)
    if len(quoted) <= SHOWN_CHARACTERS:
        return quoted
    half = SHOWN_CHARACTERS // 2 - 2
    return f"{quoted[:half]}...{quoted[-half:]} ({len(str(text))} characters)"


def count(low: int, ceiling: int):
    """`type=` for a whole number of at most `ceiling` (the refusal names `low`..`ceiling`)."""
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:  # also a number of more digits than Python converts (4300)
            value = None
        if value is None or value > ceiling:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a count of {low}..{ceiling}; valid: a whole "
                                             f"number in {low}..{ceiling}")
        return value
    return parse


def amount(low: float, ceiling: float):
    """`type=` for a finite number of at most `ceiling` (a fraction allowed: --cpus-per-cell 0.5)."""
    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            value = math.nan
        if not value <= ceiling:  # nan, inf and anything above
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of {low:g}..{ceiling:g}; valid: a "
                                             f"number in {low:g}..{ceiling:g}")
        return value
    return parse
