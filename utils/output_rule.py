"""The output rule of stdin tests, in one place: the judge (`sandbox.judge.stdout_matches`) and the
shown-test rule (`utils.shown_tests`) read printed answers by it.

An output matches an expected text when their non-empty lines pair up (blank lines and the spaces at the
ends of a line do not count; line breaks do) and, within each pair of lines, their whitespace-separated
tokens pair up, each pair `token_matches`:

- equal as text; or
- the expected token is an integer (ASCII digits, an optional sign) and the printed one is an integer of
  the same value (no float spelling: `1e9` or `1000000000.0` never match 1000000007); or
- the expected token is a decimal float and the printed one a decimal number within the tolerance APPS
  statements state, "absolute or relative error at most 1e-6": |a - b| <= 1e-6 * max(1, |b|) (with a
  1e-9 relative slack for binary rounding, as checkers do), so `'%.6f'` of any answer passes.

Numbers are ASCII decimals (`float()` reads any Unicode digit: `３.５` would be 3.5), with no digit
separators and no `inf`/`nan` words; one that overflows to inf is no number (`1e999` would match any
expected `1e400`). Pure text work; imports nothing of the project.
"""

from __future__ import annotations

import math
import re

FLOAT_TOLERANCE = 1e-6  # absolute below 1, relative above: APPS statements' "absolute or relative error"
_SLACK = 1 + 1e-9  # `0.499999` for `0.5` is 1.0000000000287557e-06 apart in binary

INTEGER = re.compile(r"[+-]?[0-9]+")
DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def as_number(token: str) -> float | None:
    """The value of a decimal token, or None (not a decimal, or overflows to inf)."""
    if not DECIMAL.fullmatch(token):
        return None
    try:
        value = float(token)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _integer_digits(token: str) -> str:
    """An integer token in canonical form, without int() (which refuses > 4300 digits)."""
    negative, digits = token.startswith("-"), token.lstrip("+-").lstrip("0") or "0"
    return ("-" if negative and digits != "0" else "") + digits


def numbers_close(got: float, want: float) -> bool:
    return abs(got - want) <= FLOAT_TOLERANCE * max(1.0, abs(want)) * _SLACK


def token_matches(got: str, want: str) -> bool:
    """One printed token against one expected token (see the module docstring)."""
    if got == want:
        return True
    if INTEGER.fullmatch(want):
        return bool(INTEGER.fullmatch(got)) and _integer_digits(got) == _integer_digits(want)
    x, y = as_number(got), as_number(want)
    return x is not None and y is not None and numbers_close(x, y)


def output_lines(text: str) -> list[list[str]]:
    """The tokens of each non-empty line."""
    return [tokens for tokens in (line.split() for line in text.split("\n")) if tokens]


def tokens_match(got: list[str], want: list[str]) -> bool:
    return len(got) == len(want) and all(token_matches(a, b) for a, b in zip(got, want, strict=True))


def output_matches(actual: str, expected: str) -> bool:
    """A whole output against a whole expected text (see the module docstring)."""
    got, want = output_lines(actual), output_lines(expected)
    return len(got) == len(want) and all(tokens_match(a, b) for a, b in zip(got, want, strict=True))
