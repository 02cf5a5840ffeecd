"""The generator's ledger: it records each constant the checker's derivation asks for instead of checking it.

`tcert.checker.kinds.influence.certified_needs` asks a ledger for every constant by name with a function
computing its rigorous bound. This ledger answers with the rigorous bound itself, rounded up by a tiny relative
slack. So every constant is as tight as the checker's
recomputation allows, and any downward move of a constant by more than the slack makes the checker reject.
"""

import math
from fractions import Fraction

SLACK = Fraction(1, 2 ** 30)      # relative slack on every recorded constant (covers backend differences)


def round_up(x: Fraction) -> Fraction:
    """The smallest double >= x * (1 + SLACK), as an exact Fraction."""
    x = Fraction(x) * (1 + SLACK)
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return Fraction(f)


class FillLedger:
    """Records constants instead of checking them: the rigorous bound, rounded up."""

    def __init__(self):
        self.claimed = {}

    def const(self, name, bound) -> Fraction:
        """Record and return the constant `name`."""
        value = round_up(bound())
        self.claimed[name] = value
        return value

    def optional(self, name, bound) -> Fraction:
        """Record and return the optional constant `name` (the generator always states it)."""
        return self.const(name, bound)
