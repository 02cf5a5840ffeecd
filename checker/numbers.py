"""Exact numbers as certificates write them.

A certificate number is a string: an integer ("17", "-3"), an integer ratio ("-7/16"), or a C99 hex
float ("0x1.8p-3", "-0x0p+0"). Each denotes exactly one rational, never the nearest double to a
decimal. JSON integers are accepted where an integer is expected. Sizes are bounded so that a hostile
certificate cannot make the checker build enormous integers.
"""

import math
import re
from fractions import Fraction

from tcert.checker.errors import BadInput

MAX_DIGITS = 400          # digits in an integer or in a ratio's numerator/denominator
MAX_BINARY_EXPONENT = 4096  # |exponent| of a hex float
# Hint numbers the checker adds up in quantity (assignment duals, per-head lambdas, a hint direction,
# influence constants) are first rounded outward to multiples of 2^-GRID_BITS (`on_grid`), so that no sum
# of them grows with their count: without it, k ratios with coprime 400-digit denominators add up to a
# denominator of 1,330 k bits. Every double is on the grid, so the generator's hex floats stay exact.
GRID_BITS = 1152

_INT = re.compile(r"[+-]?[0-9]+\Z")
_RATIO = re.compile(r"([+-]?[0-9]+)/([0-9]+)\Z")
_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]+)(?:\.([0-9a-fA-F]*))?[pP]([+-]?[0-9]+)\Z")


def parse_number(text, where: str) -> Fraction:
    """Return the rational a certificate number denotes, or raise BadInput naming `where`."""
    if isinstance(text, bool):
        raise BadInput(f"{where}: expected an exact number, got a boolean")
    if isinstance(text, int):
        if abs(text).bit_length() > MAX_DIGITS * 4:
            raise BadInput(f"{where}: integer {show(text)} too large (more than {MAX_DIGITS * 4} bits)")
        return Fraction(text)
    if not isinstance(text, str):
        raise BadInput(f"{where}: expected an exact number as a string (hex float or p/q), got {type(text).__name__}")
    if len(text) > 2 * MAX_DIGITS + 8:
        raise BadInput(f"{where}: number text longer than {2 * MAX_DIGITS + 8} characters")
    if _INT.match(text):
        return Fraction(int(text))
    m = _RATIO.match(text)
    if m:
        den = int(m.group(2))
        if den == 0:
            raise BadInput(f"{where}: zero denominator in {text[:40]!r}")
        return Fraction(int(m.group(1)), den)
    m = _HEX.match(text)
    if m:
        sign, whole, frac, exp = m.group(1), m.group(2), m.group(3) or "", int(m.group(4))
        if abs(exp) > MAX_BINARY_EXPONENT:
            raise BadInput(f"{where}: binary exponent {show(exp)} outside [-{MAX_BINARY_EXPONENT}, {MAX_BINARY_EXPONENT}]")
        value = Fraction(int(whole + frac, 16), 16 ** len(frac)) * Fraction(2) ** exp
        return -value if sign == "-" else value
    raise BadInput(f"{where}: {text[:40]!r} is not an exact number (want integer, p/q or hex float)")


def parse_int(value, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """Return a JSON integer within [lo, hi], or raise BadInput naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{where}: expected an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadInput(f"{where}: {show(value)} outside [{show(lo)}, {show(hi)}]")
    return value


def parse_vector(value, where: str, length: int, length_name: str) -> list:
    """A JSON list of exactly `length` certificate numbers, as Fractions, or BadInput naming `where`
    and the dimension (`length_name`, e.g. "d_head") the length must equal."""
    if not isinstance(value, list) or len(value) != length:
        raise BadInput(f"{where}: must be a list of {length_name} = {length} exact numbers")
    return [parse_number(x, f"{where}[{i}]") for i, x in enumerate(value)]


def on_grid(q: Fraction, up: bool) -> Fraction:
    """q rounded to a multiple of 2^-GRID_BITS: down, or up when `up` (q itself when it is one)."""
    d = q.denominator
    if d & (d - 1) == 0 and d.bit_length() <= GRID_BITS + 1:
        return q
    n = q.numerator << GRID_BITS
    return Fraction(-((-n) // d) if up else n // d, 1 << GRID_BITS)


def show(q) -> str:
    """A short decimal for a number in a message, never used to decide and never raising: Fractions and
    ints of any size (integers below 10^15 exactly, other numbers to 9 significant digits, beyond float
    range as an order of magnitude, e.g. "-~1.2e+5000"), floats, or None; anything else as <= 40
    characters of its text."""
    if q is None:
        return "none"
    try:
        q = Fraction(q)
    except (TypeError, ValueError, OverflowError):
        return str(q)[:40]
    if q.denominator == 1 and abs(q.numerator) < 10 ** 15:
        return str(q.numerator)     # an integer (a count, an index, a size) exactly
    try:
        if float(q) != 0 or q == 0:
            return f"{float(q):.9g}"
    except OverflowError:
        pass
    # beyond float range (or below its smallest subnormal): an order of magnitude (log10 of an int is exact
    # enough and never overflows)
    digits = math.log10(abs(q.numerator)) - math.log10(q.denominator)
    mant, exp = 10 ** (digits - math.floor(digits)), math.floor(digits)
    return f"{'-' if q < 0 else ''}~{mant:.2g}e{exp:+d}"
