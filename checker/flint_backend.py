"""The fast backend: python-flint's Arb midpoint-radius balls.

python-flint keeps one process-global working precision (`flint.ctx.prec`). A `FlintBackend` installs
its own precision for the duration of each of its primitives (every method `Backend` declares and every
`IMat` operation) and of a `with backend.precision():` block, and restores the previous value after;
what that guarantees, and what not, is stated in `tcert.checker.interval`. The contracts are those of
`tcert.checker.interval.Backend`.
"""

import functools
from contextlib import contextmanager
from fractions import Fraction

import flint
import numpy as np

from tcert.checker.errors import Rejected
from tcert.checker.exact_rounding import ball_from_arb, ends_from_arb, near_ball_from_arb, to_arb_mat
from tcert.checker.interval import (DEFAULT_PREC, MATRIX_HOOKS, PRIMITIVES, Backend, IMat, bounded_end, fixed_end,
                                    outward)

# python-flint starts at 53 bits; operators on balls outside any backend's block use the global value,
# so it starts at the checker's default (as if a default backend were in force).
flint.ctx.prec = DEFAULT_PREC


class FlintBackend(Backend):
    """Fast backend: Arb balls at `prec` bits."""

    name = "flint"

    @contextmanager
    def precision(self):
        """Install this backend's precision as python-flint's global one for the block, then restore."""
        old = flint.ctx.prec
        flint.ctx.prec = self.prec
        try:
            yield self
        finally:
            flint.ctx.prec = old

    # --- scalars ---------------------------------------------------------------------------------
    def _exact(self, x):
        if isinstance(x, int):
            return flint.arb(flint.fmpz(x))
        return flint.arb(x)

    def interval(self, lo: Fraction, hi: Fraction):
        return self.num(lo).union(self.num(hi))

    def _endpoint(self, x, which):
        if not x.is_finite():
            raise Rejected("finite enclosure", f"a ball is not finite: {x}")
        man, exp = (x.lower() if which == 0 else x.upper()).man_exp()
        return bounded_end(int(man), int(exp), which, self.prec)

    def fixed_ends(self, m, shift):
        """Arb's ends as exact (mantissa, exponent) pairs, shifted (no Fraction per entry)."""
        lo, hi = [], []
        for row in m.rows():
            if not all(x.is_finite() for x in row):
                raise Rejected("finite enclosure", "a matrix entry is not finite")
            lo.append([fixed_end(int(a), int(e), 0, shift) for a, e in (x.lower().man_exp() for x in row)])
            hi.append([fixed_end(int(a), int(e), 1, shift) for a, e in (x.upper().man_exp() for x in row)])
        return lo, hi

    def float_ends(self, m):
        """Arb's exact ends, python-flint's float() of each (Arb's arf_get_d, correctly rounded; infinite beyond
        the float range), one step outward (`interval.outward`). A non-finite entry has an infinite or NaN end:
        the entries are tested only when some end is not finite. The ends as two lists of floats (no tuple per
        entry: each would be a container the garbage collector tracks)."""
        entries = m.data.entries() if m.shape[0] and m.shape[1] else []
        lo, hi = outward(np.array([[float(x.lower()) for x in entries], [float(x.upper()) for x in entries]]).T,
                         m.shape)
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()) and not all(x.is_finite() for x in entries):
            raise Rejected("finite enclosure", "a matrix entry is not finite")
        return lo, hi

    def exp_ends(self, m):
        """c_r compared among Arb's exact upper ends; each exp(x - c_r) and its ends as in `float_ends`. A row holds a
        non-finite entry iff its sum does (Arb's exponents do not overflow; inf and NaN propagate): then None."""
        if not (m.shape[0] and m.shape[1]):
            return None
        sums = m.data * flint.arb_mat(m.shape[1], 1, [1] * m.shape[1])
        if not all(x.is_finite() for x in sums.entries()):
            return None
        lo, hi = [], []                                 # floats, no tuple per entry (as in `float_ends`)
        for row in m.data.tolist():
            c = max(x.upper() for x in row)
            ys = [(x - c).exp() for x in row]
            lo += [float(y.lower()) for y in ys]
            hi += [float(y.upper()) for y in ys]
        lo, hi = outward(np.array([lo, hi]).T, m.shape)
        return (lo, hi) if np.isfinite(lo).all() and np.isfinite(hi).all() else None

    def exp(self, x):
        return x.exp()

    def log(self, x):
        return x.log()

    def sqrt(self, x):
        return x.sqrt()

    def cos(self, x):
        return x.cos()

    def sin(self, x):
        return x.sin()

    def _monotone(self, x, fn):
        """fn(x) for an increasing fn, from the ball's endpoints: Arb's own erf/tanh of a wide ball is
        very loose (tanh of [-1, 1] gives +-5.6) or NaN (tanh of [-11, 11]) where mpmath is tight."""
        if x.rad() == 0 or not x.is_finite():
            return fn(x)
        return fn(x.lower()).union(fn(x.upper()))

    def erf(self, x):
        return self._monotone(x, lambda v: v.erf())

    def tanh(self, x):
        return self._monotone(x, lambda v: v.tanh())

    def pi(self):
        return flint.arb.pi()

    # --- matrices ----------------------------------------------------------------------------------
    def centres(self, m):
        """Arb's own midpoints (exact) and, per row, the upper end of an enclosure of sqrt(sum_j rad_j^2)."""
        radii = []
        for row in m.data.tolist():
            if not all(x.is_finite() for x in row):
                raise Rejected("finite enclosure", "a matrix entry is not finite")
            rad = flint.arb_mat(1, len(row), [x.rad() for x in row])
            radii.append(self._endpoint((rad * rad.transpose())[0, 0].sqrt(), 1) if row else Fraction(0))
        return IMat(self, m.data.mid(), m.shape), radii

    def _from_rows(self, rows, shape):
        return IMat(self, flint.arb_mat(shape[0], shape[1], [v for row in rows for v in row])
                    if shape[0] and shape[1] else flint.arb_mat(shape[0], shape[1]), shape)

    def _from_ends(self, lo, hi):
        return to_arb_mat((lo, hi))

    def _native_ends(self, data):
        return ends_from_arb(data)

    def _native_ball(self, data):
        return ball_from_arb(data) if data.nrows() and data.ncols() else None

    def _near_ball(self, data, parts: int = 2):
        return near_ball_from_arb(data, parts) if data.nrows() and data.ncols() else None

    def _col_bounds(self, m, groups):
        """Per column (and row block) min of lower / max of upper endpoints, compared as exact Arb points
        (from the float64 ends when the matrix has them)."""
        if m.ends is not None:
            return super()._col_bounds(m, groups)
        size = m.shape[0] // groups
        out = [([], []) for _ in range(groups)]
        for col in m.data.transpose().tolist():
            if not all(x.is_finite() for x in col):
                raise Rejected("finite enclosure", "a matrix entry is not finite")
            for g, (lo, hi) in enumerate(out):
                block = col[g * size:(g + 1) * size]
                lo.append(self._endpoint(min(x.lower() for x in block), 0))
                hi.append(self._endpoint(max(x.upper() for x in block), 1))
        return out


def at_own_precision(method):
    """`method` run with python-flint's global precision set to the backend's, then restored (no change
    when it is already in force, e.g. inside `precision()` or a nested primitive)."""
    @functools.wraps(method)
    def run(self, *args):
        old = flint.ctx.prec
        if old == self.prec:
            return method(self, *args)
        flint.ctx.prec = self.prec
        try:
            return method(self, *args)
        finally:
            flint.ctx.prec = old
    return run


for _name in PRIMITIVES + MATRIX_HOOKS:
    setattr(FlintBackend, _name, at_own_precision(getattr(FlintBackend, _name)))
