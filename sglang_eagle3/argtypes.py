"""argparse types the command lines share (train_draft, bench): a bad value is a one-line error naming it."""

from __future__ import annotations

import argparse
import math


def int_at_least(low: int):
    """An integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    return parse


def finite_float(low: float, *, strict: bool):
    """A finite number above ``low`` (``strict``) or at least it; NaN and infinities are refused."""
    op = ">" if strict else ">="

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or (value <= low if strict else value < low):
            raise argparse.ArgumentTypeError(f"{value} must be a finite number {op} {low:g}")
        return value

    return parse
