"""Exact parsing of plain numbers in normalised answers, with size caps.

`parse_number` recognises a whole answer that is one number and returns it as an exact
`fractions.Fraction` (decimals are exact too: `0.1` is 1/10), so `\\frac{1}{2}`, `1/2`,
`0.5` and `5\\times10^{-1}` all compare equal without floating-point error and without
sympy. Forms: integers and decimals with a sign, scientific notation (`1.5e3`, `1.5E-3`),
`m\\times10^{k}` / `m\\cdot10^{k}` / `m*10^k`, integer powers `a^{k}`, `\\frac{a}{b}` and
`a/b` of signed decimals, and mixed numbers `2\\frac{1}{2}` (= 5/2).

Nothing here can hang or exhaust memory: a power is only evaluated when the result has at
most `MAX_BITS` bits, and digit strings longer than `MAX_DIGITS` are not converted. Past the
caps the answer is "not a plain number" and is compared as a string (so `10^{100000}`
matches only itself).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_BITS", "MAX_DIGITS", "parse_number", "power_bits", "safe_power"]

MAX_BITS = 40_000  # about 12,000 decimal digits
MAX_DIGITS = 4_000  # below CPython's int/str conversion limit of 4,300 digits

_DEC = r"(?:\d+\.\d*|\.\d+|\d+)"
_EXP = r"(?:\{([+-]?\d+)\}|([+-]?\d+))"
_DECIMAL_RE = re.compile(rf"([+-]?){_DEC}")
_SCI_RE = re.compile(rf"([+-]?)({_DEC})[eE]([+-]?\d+)")
_TIMES_TEN_RE = re.compile(rf"([+-]?)(?:({_DEC})(?:\\times|\\cdot|\*))?10\^{_EXP}")
_POWER_RE = re.compile(rf"([+-]?)(\d+)\^{_EXP}")
_SIGNED = r"[+-]?" + _DEC
_FRAC_RE = re.compile(rf"([+-]?)\\frac\{{({_SIGNED})\}}\{{({_SIGNED})\}}")
_SLASH_RE = re.compile(rf"([+-]?)({_SIGNED})/({_SIGNED})")
_MIXED_RE = re.compile(r"([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


class TooLarge(ValueError):
    """A number or power would exceed the size caps."""


def power_bits(base: Fraction, exponent: int) -> int:
    """Upper bound on the bits of numerator/denominator of `base ** exponent`."""
    if base in (0, 1, -1):
        return 1
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    return abs(exponent) * size


def safe_power(base: Fraction, exponent: int) -> Fraction:
    """Exact `base ** exponent` for an integer exponent, refusing results over `MAX_BITS`.

    Raises:
      TooLarge: if the result would have more than `MAX_BITS` bits.
      ZeroDivisionError: for a negative power of zero.
    """
    if power_bits(base, exponent) > MAX_BITS:
        raise TooLarge(f"power with about {power_bits(base, exponent)} bits")
    return base**exponent


def _decimal(text: str) -> Fraction:
    if sum(c.isdigit() for c in text) > MAX_DIGITS:
        raise TooLarge("too many digits")
    if text.startswith("+"):
        text = text[1:]
    if text.endswith("."):
        text = text[:-1]
    return Fraction(text)


def _exponent(m: re.Match[str], first: int) -> int:
    text = m.group(first) if m.group(first) is not None else m.group(first + 1)
    if len(text.lstrip("+-")) > 12:
        raise TooLarge("exponent too long")
    return int(text)


def _sign(text: str) -> int:
    return -1 if text == "-" else 1


def _parse(s: str) -> Fraction | None:
    if _DECIMAL_RE.fullmatch(s):
        return _decimal(s)
    m = _SCI_RE.fullmatch(s)
    if m:
        return _sign(m.group(1)) * _decimal(m.group(2)) * safe_power(Fraction(10), int(m.group(3)))
    m = _TIMES_TEN_RE.fullmatch(s)
    if m:
        mantissa = _decimal(m.group(2)) if m.group(2) else Fraction(1)
        return _sign(m.group(1)) * mantissa * safe_power(Fraction(10), _exponent(m, 3))
    m = _POWER_RE.fullmatch(s)
    if m:
        return _sign(m.group(1)) * safe_power(_decimal(m.group(2)), _exponent(m, 3))
    m = _MIXED_RE.fullmatch(s)
    if m:
        whole, num, den = (_decimal(m.group(i)) for i in (2, 3, 4))
        return _sign(m.group(1)) * (whole + num / den)
    m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
    if m:
        return _sign(m.group(1)) * _decimal(m.group(2)) / _decimal(m.group(3))
    return None


def parse_number(s: str) -> Fraction | None:
    """Returns the exact value of a normalised answer that is a single plain number.

    Args:
      s: a normalised answer (see `normalize_answer`; no whitespace or thousands commas).

    Returns:
      The value as a Fraction, or None if `s` is not a plain number, divides by zero, or is
      past the size caps.
    """
    if not s or len(s) > MAX_DIGITS + 64:
        return None
    try:
        return _parse(s)
    except (TooLarge, ZeroDivisionError, ValueError, OverflowError):
        return None
