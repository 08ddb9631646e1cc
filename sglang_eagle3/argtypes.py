"""argparse types the command lines share (train_draft, bench, launch_server): a bad value is a one-line error
naming it."""

from __future__ import annotations

import argparse
import math
import re
from fractions import Fraction


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


# SGLang's size suffixes (its --context-length and --max-total-tokens read them): SI with decimals, IEC whole.
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_int(low: int):
    """An integer >= ``low``, written plainly or with SGLang's suffixes: ``32k`` = 32000, ``25.6k`` = 25600,
    ``128Ki`` = 131072 (case-sensitive, as SGLang reads them)."""

    def parse(text: str) -> int:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text.strip())
        if m is None:
            return int_at_least(low)(text)
        number, suffix = m.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(f"{text!r}: decimals are not allowed with the IEC suffix {suffix}")
            value = int(number) * _IEC[suffix]
        else:
            exact = Fraction(number) * _SI[suffix]
            if exact.denominator != 1:
                raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
            value = int(exact)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    return parse


def name_the_flag(msg: str, flags: dict[str, str]) -> str:
    """An engine's ``field=value ...`` or ``field[i]=value ...`` message with the field replaced by the command
    line's flag for it, where it has one: the user typed the flag, not the field."""
    for field, flag in flags.items():
        if msg.startswith((f"{field}=", f"{field}[")):
            return flag + msg[len(field):]
    return msg
