"""How far the prediction kind raises its precision by itself before it answers REJECTED.

The enclosures of the rigorous forward pass are a fixed multiple of 2^-prec wide (docs/soundness.md, "The
forward pass's error model"): every source of width is a rounding at the working precision, amplified
by the same Lipschitz constants whatever the precision. So when a claimed margin m is thinner than the
enclosure at the starting precision p, the width w at p predicts the precision at which the certified
lower bound would reach m: lower(p') ~ mid - w 2^(p - p') / 2 >= m needs p' >= p + log2(w / (2 (mid - m))).
`next_precision` takes that (plus SAFETY_BITS, rounded up to a multiple of STEP bits, at least one step
up). The raise stops, and the claim is REJECTED, when

* the claim is refuted: an upper bound of some gap is below m, so no precision can help;
* the next precision would pass MAX_PREC bits ("higher precision might still help");
* the work of all passes so far plus the next would pass WORK_LIMIT times the first pass's work, with
  a pass at prec bits costing `pass_cost(prec)` times one at 64 bits ("higher precision might still help").

Before the ladder, a coarse pass (`coarse_gap`): where the exact layer is on at a precision above
COARSE_PREC, the whole rigorous pass first runs at COARSE_PREC bits, where centres keep fewer digits
(`error_balls.trimmed_centre`: the high word of each exact result), and with spectral norms from a shorter
trace-power chain (COARSE_SQUARINGS: ||W||_2 <= tr(G^2)^(1/4), G the Gram matrix, at most rank^(1/4) above
it, instead of tr(G^32)^(1/64) by four squarings; the same proof in `operator_norms.gram_lambda_bound`,
k = 0). It is as rigorous as any rung, only looser: when it proves the margin the claim is VERIFIED at COARSE_PREC; otherwise the ladder runs unchanged
from the starting precision (the coarse pass is not counted in its work, so its stops are the same as
without it).

This is a simple documented cap, not a resource model: prec <= 1024 and at most 24 first-pass
equivalents of work. A prediction is only evaluated, never trusted: every rung recomputes the whole
forward pass at its own precision and the verdict compares exact Fractions.
"""

from fractions import Fraction

COARSE_PREC = 48      # the coarse first pass (`coarse_gap` in __init__.py) runs at this many bits
COARSE_SQUARINGS = 0  # ... with spectral norms tr(G^2)^(1/4) (operator_norms.operator_norm, no squaring of G)
MAX_PREC = 1024       # the checker never raises beyond this many bits
WORK_LIMIT = 24       # total work of all passes <= WORK_LIMIT x the first pass's
SAFETY_BITS = 16      # added to the predicted precision
STEP = 32             # precisions are multiples of this many bits


def pass_cost(prec: int) -> Fraction:
    """The work of a forward pass at `prec` bits relative to one at 64 bits: Arb and mpmath multiply
    mantissas limb by limb, and the stored weights stay 24-53 bits, so the cost grows about linearly."""
    return Fraction(max(prec, 64), 64)


def ceil_log2(x: Fraction) -> int:
    """An integer b >= log2(x), exceeding it by less than 1 (0 when x <= 1), in integer arithmetic."""
    whole = -(-x.numerator // x.denominator)         # ceil(x) >= x, and 2^b >= ceil(x) for this b
    return max(0, (whole - 1).bit_length())


def next_precision(prec: int, gaps: list, margin: Fraction):
    """The precision predicted to lift every gap's lower bound to `margin`, from the (lower, upper) bounds
    `gaps` at `prec` bits: at least prec + STEP, a multiple of STEP (not capped here)."""
    want = prec + STEP
    for lo, hi in gaps:
        if lo >= margin:
            continue
        need, width = (lo + hi) / 2 - margin, hi - lo
        if need <= 0 or width <= 0:
            want = max(want, 2 * prec)       # the claim is at or above the midpoint: try a large step
            continue
        want = max(want, prec + ceil_log2(width / (2 * need)) + SAFETY_BITS)
    return -(-want // STEP) * STEP
