"""Rigorous interval arithmetic behind one small interface, with two interchangeable backends.

`MpmathBackend` (mpmath's `iv` context) is the reference; `FlintBackend` (python-flint's Arb balls)
is the fast one. Verification rules only use the `Backend` methods and the `IMat` operators below, so
they read the same whichever backend runs them.

Every value is an enclosure: the exact real result lies inside it. Stored weights enter exactly
(float16/32/64 values are binary rationals and both libraries hold doubles exactly). Results leave the
interval world only through `lower`/`upper`, which return exact `Fraction` endpoints; all verdicts are
comparisons between such Fractions. An enclosure that is not finite raises `Rejected`, so comparisons
fail closed.
"""

from fractions import Fraction
from operator import mul

import mpmath
import numpy as np
from mpmath import libmp

from tcert.checker.errors import Rejected

DEFAULT_PREC = 64


class IMat:
    """A matrix of intervals; `backend` says whose native matrix `data` is."""

    __slots__ = ("backend", "data", "shape")

    def __init__(self, backend, data, shape):
        self.backend, self.data, self.shape = backend, data, shape

    def __matmul__(self, other):
        if self.shape[1] != other.shape[0]:
            raise ValueError(f"matmul shapes {self.shape} @ {other.shape}")
        return self.backend._matmul(self, other)

    def __add__(self, other):
        return self.backend._add(self, other)

    def __sub__(self, other):
        return self.backend._sub(self, other)

    def scale(self, s):
        """Every entry times the interval scalar `s`."""
        return self.backend._scale(self, s)

    @property
    def T(self):
        return self.backend._transpose(self)

    def rows(self):
        """The entries as a list of row lists of interval scalars."""
        return self.backend._rows(self)

    def map(self, fn):
        """Apply a scalar interval function to every entry."""
        return self.backend.matrix([[fn(x) for x in row] for row in self.rows()])

    def col_bounds(self, groups: int | None = None):
        """(lo, hi): per column, an exact Fraction <= every entry and one >= every entry.

        With groups = g the rows are cut into g equal consecutive blocks and a list of g such
        (lo, hi) pairs is returned, one per block."""
        if groups is None:
            return self.backend._col_bounds(self, 1)[0]
        if self.shape[0] % groups:
            raise ValueError(f"{self.shape[0]} rows do not split into {groups} groups")
        return self.backend._col_bounds(self, groups)


class Backend:
    """What a verification rule may use. Subclasses supply the native operations."""

    name = "abstract"

    def __init__(self, prec: int = DEFAULT_PREC):
        self.prec = prec

    # --- scalars -------------------------------------------------------------------
    def num(self, x):
        """The enclosure of an exact int, Fraction or (exactly held) Python float."""
        if isinstance(x, Fraction):
            if x.denominator == 1:
                return self._exact(x.numerator)
            return self._exact(x.numerator) / self._exact(x.denominator)
        if isinstance(x, (int, float)):
            return self._exact(x)
        if isinstance(x, np.floating):
            return self._exact(float(x))
        raise TypeError(f"cannot make an interval from {type(x).__name__}")

    def lower(self, x) -> Fraction:
        """An exact rational that is <= every point of `x`."""
        return self._endpoint(x, 0)

    def upper(self, x) -> Fraction:
        """An exact rational that is >= every point of `x`."""
        return self._endpoint(x, 1)

    def abs_upper(self, x) -> Fraction:
        """An exact rational >= |v| for every point v of `x`."""
        return max(-self.lower(x), self.upper(x))

    def hull_max(self, xs):
        """An enclosure of max(v_1, ..., v_n) over points v_i of the intervals xs."""
        xs = list(xs)
        lo = max(self.lower(x) for x in xs)
        hi = max(self.upper(x) for x in xs)
        return self.interval(lo, hi)

    def hull_min(self, xs):
        """An enclosure of min(v_1, ..., v_n) over points v_i of the intervals xs."""
        xs = list(xs)
        lo = min(self.lower(x) for x in xs)
        hi = min(self.upper(x) for x in xs)
        return self.interval(lo, hi)

    def fsum(self, xs):
        """Interval sum of an iterable of interval scalars."""
        total = self._exact(0)
        for x in xs:
            total = total + x
        return total

    # --- matrices --------------------------------------------------------------------
    def array(self, a) -> IMat:
        """The exact matrix of a 1-D or 2-D numpy array of stored weights (a vector becomes a row)."""
        a = np.asarray(a)
        if a.ndim == 1:
            a = a[None, :]
        if a.dtype.kind != "f":
            a = a.astype(np.int64)
            return self._from_rows(a.tolist(), a.shape)
        return self._from_rows(a.astype(np.float64).tolist(), a.shape)

    def matrix(self, rows) -> IMat:
        """A matrix from a non-empty list of equal-length lists of interval scalars."""
        shape = (len(rows), len(rows[0]) if rows else 0)
        return self._from_rows(rows, shape)

    def dot(self, xs, ys):
        """Interval inner product of two equal-length lists of interval scalars."""
        return (self.matrix([list(xs)]) @ self.matrix([[y] for y in ys])).rows()[0][0]

    def _col_bounds(self, m, groups):
        cols, size = m.T.rows(), m.shape[0] // groups
        return [([min(self.lower(x) for x in c[g * size:(g + 1) * size]) for c in cols],
                 [max(self.upper(x) for x in c[g * size:(g + 1) * size]) for c in cols]) for g in range(groups)]


class MpmathBackend(Backend):
    """Reference backend: mpmath's interval context `iv`, outward rounding at `prec` bits."""

    name = "mpmath"

    def __init__(self, prec: int = DEFAULT_PREC):
        super().__init__(prec)
        self.iv = mpmath.iv
        self.iv.prec = prec

    def _exact(self, x):
        return self.iv.mpf(x) if not isinstance(x, int) or abs(x).bit_length() <= self.prec else \
            self.iv.mpf(str(x))

    def interval(self, lo: Fraction, hi: Fraction):
        """The interval [lo, hi] (outward-rounded)."""
        return self.iv.mpf([self.num(lo).a, self.num(hi).b])

    def _endpoint(self, x, which):
        raw = x._mpi_[which]
        if raw in (libmp.fnan, libmp.finf, libmp.fninf):
            raise Rejected("finite enclosure", f"an interval endpoint is {libmp.to_str(raw, 5)}")
        sign, man, exp, _ = raw
        value = Fraction(man) * (Fraction(2) ** exp)
        return -value if sign else value

    def exp(self, x):
        return self.iv.exp(x)

    def _real(self, fn, x, name):
        """fn(x); where x reaches below 0 mpmath raises ComplexResult (Arb gives NaN): reject alike."""
        try:
            return fn(x)
        except libmp.ComplexResult:
            raise Rejected("finite enclosure", f"{name} of an interval reaching below 0") from None

    def log(self, x):
        return self._real(self.iv.log, x, "log")

    def sqrt(self, x):
        return self._real(self.iv.sqrt, x, "sqrt")

    def cos(self, x):
        return self.iv.cos(x)

    def sin(self, x):
        return self.iv.sin(x)

    def erf(self, x):
        """erf is increasing with 0 < erf' <= 2/sqrt(pi), so erf([a, b]) lies in [lower erf(a), upper
        (erf(a) + 2 (b - a) / sqrt(pi))], and in [lower erf(a), upper erf(b)] (used when b - a > 2^-16).
        erf is not in mpmath's iv context and mpmath's point erf has no proven error bound, so erf at a
        point is enclosed by `_erf_point` in interval arithmetic."""
        at_a = self._erf_point(x.a)
        if x.a == x.b:
            return at_a
        width = x.b - x.a
        hi = min((at_a + 2 * width / self.iv.sqrt(self.iv.pi)).b, 1)
        if self._endpoint(width, 1) > Fraction(1, 1 << 16):
            hi = min(hi, self._erf_point(x.b).b)
        return self.iv.mpf([at_a.a, hi])

    def _erf_point(self, p):
        """A rigorous enclosure of erf(p) for a zero-width interval p; erf(-t) = -erf(t), t = |p|.

        t^2 > 0.7 (prec + 20): 0 < erfc(t) <= exp(-t^2) / (t sqrt(pi)) (integrate e^(-s^2) <= (s/t) e^(-s^2)
        over s >= t). Otherwise the Taylor series erf(t) = 2/sqrt(pi) sum_n (-1)^n a_n, a_n = t^(2n+1) /
        (n! (2n+1)), summed below the first N with N + 1 >= 2 t^2 and a_N < 2^-wp: for n >= N,
        a_(n+1) / a_n = t^2 (2n+1) / ((n+1)(2n+3)) <= t^2 / (N+1) <= 1/2, so the tail is within 2 a_N.
        """
        iv, t_exact = self.iv, abs(self._endpoint(p, 0))
        if t_exact == 0:
            return iv.mpf(0)
        sign, t2_exact, old = (-1 if self._endpoint(p, 0) < 0 else 1), t_exact * t_exact, iv.prec
        tail_form = t2_exact > Fraction(7, 10) * (self.prec + 20)
        # Taylor: the largest term is ~ e^(t^2), so its cancellation costs ~1.44 t^2 bits
        wp = self.prec + 16 + (0 if tail_form else 3 * int(t2_exact) // 2)
        try:
            iv.prec = wp
            t = iv.mpf(abs(p))
            root_pi = iv.sqrt(iv.pi)
            if tail_form:
                erfc = iv.exp(-(t * t)) / (t * root_pi)
                r = iv.mpf([(1 - erfc).a, 1])
            else:
                t2, term, total, n, small = t * t, t, iv.mpf(0), 0, libmp.from_man_exp(1, -wp)
                while True:
                    a = term / (2 * n + 1)
                    if n + 1 >= 2 * t2_exact and libmp.mpf_lt(a._mpi_[1], small):
                        break
                    total = total + a if n % 2 == 0 else total - a
                    term = term * t2 / (n + 1)
                    n += 1
                tail = 2 * self._endpoint(a, 1)
                r = 2 * (total + self.interval(-tail, tail)) / root_pi
            r = r if sign > 0 else -r
        finally:
            iv.prec = old
        return iv.mpf([r.a, r.b])

    def tanh(self, x):
        return self.iv.tanh(x) if hasattr(self.iv, "tanh") else \
            (self.iv.exp(2 * x) - 1) / (self.iv.exp(2 * x) + 1)

    def pi(self):
        return self.iv.pi

    def _from_rows(self, rows, shape):
        m = self.iv.matrix(shape[0], shape[1])
        make, from_float, ivmpf = self.iv.make_mpf, libmp.from_float, self.iv.mpf
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                if isinstance(v, float):  # a stored weight: a double is exact at 53 bits
                    f = from_float(v, 53, libmp.round_nearest)
                    m[i, j] = make((f, f))
                else:
                    m[i, j] = v if isinstance(v, ivmpf) else self._exact(v)
        return IMat(self, m, shape)

    def _matmul(self, a, b):
        """Product of interval matrices; when one factor is a point matrix (stored weights), by exact
        integer dot products rounded outward once (much faster than mpmath's per-entry intervals)."""
        shape = (a.shape[0], b.shape[1])
        a_rows, b_rows = a.data.tolist(), b.data.tolist()
        if all(x._mpi_[0] == x._mpi_[1] for row in b_rows for x in row):
            rows = self._point_product(a_rows, b_rows)
        elif all(x._mpi_[0] == x._mpi_[1] for row in a_rows for x in row):
            # (A B)^T = B^T A^T with the point factor on the right.
            t = self._point_product([list(c) for c in zip(*b_rows)], [list(c) for c in zip(*a_rows)])
            rows = None if t is None else [list(c) for c in zip(*t)]
        else:
            rows = None
        if rows is None:  # interval x interval, or a non-finite entry: mpmath's own product
            return IMat(self, a.data * b.data, shape)
        return self._from_rows(rows, shape)

    def _point_product(self, a_rows, w_rows):
        """Rows of A @ W for an interval matrix A and a point matrix W, or None on non-finite entries.

        Every endpoint is an exact integer times a common power of two; with W = W+ + W- split by
        sign, lower = A_lo W+ + A_hi W- and upper = A_hi W+ + A_lo W- hold exactly in integers, and
        each is rounded outward to `prec` bits once.
        """
        lo_hi = [[x._mpi_ for x in row] for row in a_rows]
        a_ends = [e for row in lo_hi for pair in row for e in pair]
        w_pts = [x._mpi_[0] for row in w_rows for x in row]
        special = (libmp.fnan, libmp.finf, libmp.fninf)
        if any(e in special for e in a_ends) or any(e in special for e in w_pts):
            return None
        a_exp = min((e[2] for e in a_ends if e[1]), default=0)
        w_exp = min((e[2] for e in w_pts if e[1]), default=0)

        def to_int(e, base):
            sign, man, exp, _ = e
            value = man << (exp - base) if man else 0
            return -value if sign else value

        a_lo = [[to_int(p[0], a_exp) for p in row] for row in lo_hi]
        a_hi = [[to_int(p[1], a_exp) for p in row] for row in lo_hi]
        w_cols = list(zip(*[[to_int(x._mpi_[0], w_exp) for x in row] for row in w_rows]))
        pos = [[max(v, 0) for v in col] for col in w_cols]
        neg = [[min(v, 0) for v in col] for col in w_cols]
        exp, prec = a_exp + w_exp, self.prec
        down, up, make = libmp.round_floor, libmp.round_ceiling, self.iv.make_mpf
        out = []
        for lo_row, hi_row in zip(a_lo, a_hi):
            row = []
            for p, n in zip(pos, neg):
                low = sum(map(mul, lo_row, p)) + sum(map(mul, hi_row, n))
                high = sum(map(mul, hi_row, p)) + sum(map(mul, lo_row, n))
                row.append(make((libmp.from_man_exp(low, exp, prec, down),
                                 libmp.from_man_exp(high, exp, prec, up))))
            out.append(row)
        return out

    def _add(self, a, b):
        return IMat(self, a.data + b.data, a.shape)

    def _sub(self, a, b):
        return IMat(self, a.data - b.data, a.shape)

    def _scale(self, a, s):
        return IMat(self, a.data * s, a.shape)

    def _transpose(self, a):
        return IMat(self, a.data.T, (a.shape[1], a.shape[0]))

    def _rows(self, a):
        return a.data.tolist()


class FlintBackend(Backend):
    """Fast backend: python-flint's Arb midpoint-radius balls at `prec` bits."""

    name = "flint"

    def __init__(self, prec: int = DEFAULT_PREC):
        super().__init__(prec)
        import flint

        self.flint = flint
        flint.ctx.prec = prec

    def _exact(self, x):
        if isinstance(x, int):
            return self.flint.arb(self.flint.fmpz(x))
        return self.flint.arb(x)

    def interval(self, lo: Fraction, hi: Fraction):
        """The ball enclosing [lo, hi]."""
        return self.num(lo).union(self.num(hi))

    def _endpoint(self, x, which):
        if not x.is_finite():
            raise Rejected("finite enclosure", f"a ball is not finite: {x}")
        end = x.lower() if which == 0 else x.upper()
        man, exp = end.man_exp()
        man, exp = int(man), int(exp)
        return Fraction(man << exp) if exp >= 0 else Fraction(man, 1 << -exp)

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
        return self.flint.arb.pi()

    def _from_rows(self, rows, shape):
        return IMat(self, self.flint.arb_mat(shape[0], shape[1], [v for row in rows for v in row])
                    if shape[0] and shape[1] else self.flint.arb_mat(shape[0], shape[1]), shape)

    def _matmul(self, a, b):
        return IMat(self, a.data * b.data, (a.shape[0], b.shape[1]))

    def _add(self, a, b):
        return IMat(self, a.data + b.data, a.shape)

    def _sub(self, a, b):
        return IMat(self, a.data - b.data, a.shape)

    def _scale(self, a, s):
        return IMat(self, a.data * s, a.shape)

    def _transpose(self, a):
        return IMat(self, a.data.transpose(), (a.shape[1], a.shape[0]))

    def _rows(self, a):
        return a.data.tolist()

    def _col_bounds(self, m, groups):
        """Per column (and row block) min of lower / max of upper endpoints, compared as exact Arb points."""
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


BACKENDS = {"mpmath": MpmathBackend, "flint": FlintBackend}


def make_backend(name: str, prec: int = DEFAULT_PREC) -> Backend:
    """The backend called `name` ("mpmath" or "flint") at `prec` bits."""
    return BACKENDS[name](prec)
