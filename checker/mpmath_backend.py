"""The reference backend: mpmath's interval arithmetic (endpoint intervals, outward rounding).

Each `MpmathBackend` owns a fresh `mpmath.ctx_iv.MPIntervalContext` at its precision, so its values
never depend on another backend's precision (mpmath's shared `mpmath.iv` is not used). Two things are
the checker's own code on top of mpmath: `erf` (not in mpmath's interval context; enclosed by a series
with an explicit tail bound) and products with a point factor (exact integer dot products, rounded
outward once). The contracts are those of `tcert.checker.interval.Backend`.
"""

from fractions import Fraction
from operator import mul

from mpmath import libmp
from mpmath.ctx_iv import MPIntervalContext

from tcert.checker.errors import Rejected
from tcert.checker.exact_rounding import _parts, ends_from_mpf, to_mpf_rows
from tcert.checker.interval import DEFAULT_PREC, Backend, IMat, bounded_end

SPECIAL = (libmp.fnan, libmp.finf, libmp.fninf)
MAX_SHIFT = 1 << 16   # bits of an exact integer in the point products; wider spreads use mpmath's own product


class MpmathBackend(Backend):
    """Reference backend: an interval context of its own, outward rounding at `prec` bits."""

    name = "mpmath"

    def __init__(self, prec: int = DEFAULT_PREC, exact: bool = False):
        super().__init__(prec, exact)
        self.iv = MPIntervalContext()
        self.iv.prec = prec

    # --- scalars ---------------------------------------------------------------------------------
    def _exact(self, x):
        if isinstance(x, int):   # rounded outward at prec bits by integer operations (no decimal text)
            return self._ratio(x, 1)
        return self.iv.mpf(x)

    def num(self, x):
        if isinstance(x, Fraction):
            return self._ratio(x.numerator, x.denominator)
        return super().num(x)

    def _ratio(self, p: int, q: int):
        """The enclosure of p/q (q > 0): one division of exact integers rounded down and one up (a point
        when p/q is a dyadic of at most prec bits)."""
        a, b = libmp.from_int(p), libmp.from_int(q)
        return self.iv.make_mpf((libmp.mpf_div(a, b, self.prec, libmp.round_floor),
                                 libmp.mpf_div(a, b, self.prec, libmp.round_ceiling)))

    def interval(self, lo: Fraction, hi: Fraction):
        return self.iv.mpf([self.num(lo).a, self.num(hi).b])

    def _endpoint(self, x, which):
        raw = x._mpi_[which]
        if raw in SPECIAL:
            raise Rejected("finite enclosure", f"an interval endpoint is {libmp.to_str(raw, 5)}")
        sign, man, exp, _ = raw
        return bounded_end(-man if sign else man, exp, which, self.prec)

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

    def tanh(self, x):
        # mpmath's interval context has no tanh: (e^2x - 1) / (e^2x + 1), each part an enclosure
        return (self.iv.exp(2 * x) - 1) / (self.iv.exp(2 * x) + 1)

    def pi(self):
        return self.iv.pi

    # --- erf ---------------------------------------------------------------------------------------
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
        over s >= t). Otherwise the Taylor series (`_erf_series`).
        """
        iv = self.iv
        if p == 0:
            return iv.mpf(0)
        sign, old = (-1 if p < 0 else 1), iv.prec
        # t > 64 takes the tail form (valid for every t > 0), else t2_exact >= t^2 (= t^2 unless t < 2^-MAX_EXP)
        big = abs(p) > 64
        t2_exact = None if big else self._endpoint(iv.mpf(abs(p)), 1) ** 2
        tail_form = big or t2_exact > Fraction(7, 10) * (self.prec + 20)
        # Taylor: the largest term is ~ e^(t^2), so its cancellation costs ~1.44 t^2 bits
        wp = self.prec + 16 + (0 if tail_form else 3 * int(t2_exact) // 2)
        try:
            iv.prec = wp
            t = iv.mpf(abs(p))
            if tail_form:
                erfc = iv.exp(-(t * t)) / (t * iv.sqrt(iv.pi))
                r = iv.mpf([(1 - erfc).a, 1])
            else:
                r = self._erf_series(t, t2_exact, wp)
            r = r if sign > 0 else -r
        finally:
            iv.prec = old
        return iv.mpf([r.a, r.b])

    def _erf_series(self, t, t2_exact, wp):
        """erf(t) = 2/sqrt(pi) sum_n (-1)^n a_n, a_n = t^(2n+1) / (n! (2n+1)), summed below the first N with
        N + 1 >= 2 t^2 and a_N < 2^-wp: for n >= N, a_(n+1) / a_n = t^2 (2n+1) / ((n+1)(2n+3)) <= t^2 / (N+1)
        <= 1/2, so the tail is within 2 a_N. Runs at the working precision `wp` the caller set."""
        iv = self.iv
        t2, term, total, n, small = t * t, t, iv.mpf(0), 0, libmp.from_man_exp(1, -wp)
        while True:
            a = term / (2 * n + 1)
            if n + 1 >= 2 * t2_exact and libmp.mpf_lt(a._mpi_[1], small):
                break
            total = total + a if n % 2 == 0 else total - a
            term = term * t2 / (n + 1)
            n += 1
        tail = 2 * self._endpoint(a, 1)
        return 2 * (total + self.interval(-tail, tail)) / iv.sqrt(iv.pi)

    # --- matrices ----------------------------------------------------------------------------------
    def centres(self, m):
        """Per entry [a, b]: the point c = (a + b)/2, rounded to nearest at `prec` bits (halving is exact), and
        r = max(b - c, c - a) rounded up; per row the upper end of an enclosure of sqrt(sum_j r_j^2)."""
        prec, make, points, radii = self.prec, self.iv.make_mpf, [], []
        near, up, lt = libmp.round_nearest, libmp.round_ceiling, libmp.mpf_lt
        for row in m.data.tolist():
            out, total = [], self.iv.mpf(0)
            for x in row:
                a, b = x._mpi_
                if a in SPECIAL or b in SPECIAL:
                    raise Rejected("finite enclosure", "a matrix entry is not finite")
                c = libmp.mpf_shift(libmp.mpf_add(a, b, prec, near), -1)
                r1, r2 = libmp.mpf_sub(b, c, 32, up), libmp.mpf_sub(c, a, 32, up)
                r = make((r2, r2)) if lt(r1, r2) else make((r1, r1))
                total += r * r
                out.append(make((c, c)))
            points.append(out)
            radii.append(self._endpoint(self.iv.sqrt(total), 1))
        return self._from_rows(points, m.shape), radii

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

    def _from_ends(self, lo, hi):
        m, make = self.iv.matrix(*_parts(lo)[0].shape), self.iv.make_mpf
        for i, row in enumerate(to_mpf_rows((lo, hi))):
            for j, pair in enumerate(row):
                m[i, j] = make(pair)
        return m

    def _native_ends(self, data):
        return ends_from_mpf(data.tolist())

    def _native_matmul(self, a, b):
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
            return super()._native_matmul(a, b)
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
        if any(e in SPECIAL for e in a_ends) or any(e in SPECIAL for e in w_pts):
            return None
        a_exp = min((e[2] for e in a_ends if e[1]), default=0)
        w_exp = min((e[2] for e in w_pts if e[1]), default=0)
        if _spread(a_ends, a_exp) > MAX_SHIFT or _spread(w_pts, w_exp) > MAX_SHIFT:   # e^(3e38) beside 1: mpmath's
            return None                                                              # own product (no 2^1e38-bit int)
        a_lo = [[_scaled_int(p[0], a_exp) for p in row] for row in lo_hi]
        a_hi = [[_scaled_int(p[1], a_exp) for p in row] for row in lo_hi]
        w_cols = list(zip(*[[_scaled_int(x._mpi_[0], w_exp) for x in row] for row in w_rows]))
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


def _spread(ends, base: int) -> int:
    """The bits of the largest exact integer `_scaled_int(e, base)` gives over `ends`."""
    return max((e[2] + e[3] - base for e in ends if e[1]), default=0)


def _scaled_int(e, base: int) -> int:
    """The finite mpf `e` as an exact integer multiple of 2^base (base <= e's exponent)."""
    sign, man, exp, _ = e
    value = man << (exp - base) if man else 0
    return -value if sign else value
