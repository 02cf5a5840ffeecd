"""Rigorous interval arithmetic behind one declared interface, with two interchangeable backends.

`Backend` below declares every primitive a verification rule may use, each with its contract; `IMat` is
the matrix type its rules multiply, add and bound. Two modules implement it: `mpmath_backend`
(`MpmathBackend`, mpmath's interval arithmetic: the reference) and `flint_backend` (`FlintBackend`,
python-flint's Arb balls: the fast default). `make_backend(name, prec)` builds one. Rules only call
the methods declared here and combine the values they return with `+ - * /`, unary `-` and ints, so
they read the same whichever backend runs them.

The contract every primitive keeps:
* Every value is an enclosure: the exact real result lies inside it. Stored weights and exact inputs
  enter exactly (float16/32/64 values are binary rationals; both libraries hold doubles exactly).
* Results leave the interval world only through `lower` / `upper` / `abs_upper`, which return exact
  `Fraction` endpoints; every verdict is a comparison between such Fractions.
* It fails closed: an enclosure that is not finite (NaN, infinity, log or sqrt of an interval reaching
  below 0, division by an interval holding 0) raises `Rejected` at the latest when its endpoints are
  read, so no comparison can pass on it.

Precision belongs to the backend (`backend.prec`, bits):
* mpmath: each `MpmathBackend` owns a fresh interval context, and every value it makes carries that
  context; operators on those values round at that backend's precision whatever other backends exist.
  `precision()` has nothing to install.
* python-flint has one process-global working precision (`flint.ctx.prec`). A `FlintBackend` never
  changes it for good: each of its own primitives (every method declared here and every `IMat`
  operation) sets it to `backend.prec` for its duration and restores the previous value, and
  `with backend.precision():` does the same for a whole block. `verify()` runs every check inside that
  block, so during a check every operation, the rules' own operators on Arb balls included, works at
  the backend's precision, and two flint backends at different precisions used one after the other in
  one process give the results each gives alone. Not guaranteed: operators applied to Arb balls
  *outside* such a block (a test or the generator calling a rule directly) use whatever the global
  precision is at that moment (`flint_backend` sets it to DEFAULT_PREC once, on import, so default
  backends compute as they do inside a check). The results are still enclosures; only their width
  depends on it. No guarantee between threads (python-flint's precision is not thread-local).
"""

from abc import ABC, abstractmethod
from contextlib import contextmanager
from fractions import Fraction

import numpy as np

from tcert.checker import exact_backend
from tcert.checker.errors import Rejected

DEFAULT_PREC = 64
BACKENDS = ("flint", "mpmath")
# The names offered to users (tcert-check --backend, tcert.api.check): each backend at its default, then with
# the exact product layer switched (make_backend also takes the redundant "flint+exact", "mpmath-exact").
BACKEND_NAMES = ("flint", "flint-exact", "mpmath", "mpmath+exact")
# Every exact rational leaving the interval world (`lower` / `upper` / `abs_upper`) is 0 or a dyadic
# m 2^e with |m| < 2^prec and 2^-MAX_EXP <= |m 2^e| < 2^MAX_EXP, so it costs at most MAX_EXP + prec bits
# (docs/soundness.md, "Exact numbers are bounded"): a smaller magnitude is rounded outward (to 0 or
# +-2^-MAX_EXP), a larger one fails closed (Rejected), whatever the enclosure's own exponent is
# (exp(-5e7) is an Arb ball with a 27-bit exponent, but would be a Fraction of 7e7 bits).
MAX_EXP = 1 << 14
FLOAT_MAX = Fraction(float.fromhex("0x1.fffffffffffffp+1023"))     # the largest float64 (`Backend.float_ends`)

# The declared interface: the public primitives and the IMat operations' backend hooks. FlintBackend
# runs each of these at its own precision; tests check that both backends implement every one.
PRIMITIVES = ("num", "interval", "lower", "upper", "abs_upper", "exp", "log", "sqrt", "cos", "sin", "erf",
              "tanh", "pi", "fsum", "array", "matrix", "dot", "centres", "fixed_ends", "float_ends",
              "exp_ends")
MATRIX_HOOKS = ("_from_rows", "_from_ends", "_matmul", "_add", "_sub", "_scale", "_transpose", "_rows",
                "_col_bounds")
# The exact layer runs on a backend made with exact=True: "flint" by default (and "+exact" names); the
# reference "mpmath" keeps its own products, so the backend-agreement tests compare the layer with an
# independent implementation. Above this precision products stay in the libraries: the layer's results
# leave it as two float64 parts per end (about 2^-105 of their scale) and its interval operands enter as two float64
# parts per end, exact for endpoints of up to 64 bits.
EXACT_DEFAULT = {"flint": True, "mpmath": False}
EXACT_MAX_PREC = 64


class IMat:
    """A matrix of enclosures; `backend` says whose native matrix `data` is. Every operation returns
    entry-wise enclosures of the exact result.

    `ends`, when not None, holds the entries as float64 arrays (lo, hi) with lo <= entry <= hi exactly,
    the same array twice for a point matrix (stored weights); `data` is then built from them on first
    use. Products with a point factor, transposes and column bounds work on `ends` without building
    one native object per entry (`tcert.checker.exact_backend`); `cuts` caches a point matrix's digits."""

    __slots__ = ("backend", "_data", "shape", "ends", "cuts")

    def __init__(self, backend, data, shape, ends=None):
        self.backend, self._data, self.shape, self.ends, self.cuts = backend, data, shape, ends, {}

    @property
    def data(self):
        """The backend's native matrix (built from `ends` on first use)."""
        if self._data is None:
            self._data = self.backend._from_ends(*self.ends)
        return self._data

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
        """The transpose."""
        return self.backend._transpose(self)

    def rows(self):
        """The entries as a list of row lists of interval scalars."""
        return self.backend._rows(self)

    def map(self, fn):
        """Apply a scalar interval function to every entry."""
        return self.backend.matrix([[fn(x) for x in row] for row in self.rows()])

    def col_bounds(self, groups: int | None = None):
        """(lo, hi): per column, an exact Fraction <= every entry and one >= every entry (Rejected if an
        entry is not finite).

        With groups = g the rows are cut into g equal consecutive blocks and a list of g such
        (lo, hi) pairs is returned, one per block."""
        if groups is None:
            return self.backend._col_bounds(self, 1)[0]
        if self.shape[0] % groups:
            raise ValueError(f"{self.shape[0]} rows do not split into {groups} groups")
        return self.backend._col_bounds(self, groups)

    def col_extremes(self, groups: int | None = None):
        """As `col_bounds`, but each end of a matrix held as ends is a pair of float64 arrays (exact, in
        split form: `exact_backend.column_extremes`) for `exact_backend.merge_extremes` to merge without one
        Python number per column; `exact_backend.fractions` gives the Fractions."""
        if self.ends is None or self.shape[0] % (groups or 1):
            return self.col_bounds(groups)
        out = exact_backend.column_extremes(self.ends, groups or 1)
        return out if groups else out[0]


class Backend(ABC):
    """What a verification rule may use. A subclass supplies the native scalar operations (the abstract
    methods) and may replace a shared matrix operation by a faster one with the same contract."""

    name = "abstract"

    def __init__(self, prec: int = DEFAULT_PREC, exact: bool = False):
        self.prec, self.exact = prec, exact

    @contextmanager
    def precision(self):
        """While the block runs, every operation on this backend's values works at `self.prec` bits
        (verify() runs each check inside it). Here: nothing to install, values carry their precision."""
        yield self

    # --- scalars in and out ----------------------------------------------------------------------
    def num(self, x):
        """The enclosure of an exact int, Fraction or (exactly held) Python or numpy float; TypeError
        for anything else (a decimal string is not a number here)."""
        if isinstance(x, Fraction):
            if x.denominator == 1:
                return self._exact(x.numerator)
            return self._exact(x.numerator) / self._exact(x.denominator)
        if isinstance(x, (int, float)):
            return self._exact(x)
        if isinstance(x, np.floating):
            return self._exact(float(x))
        raise TypeError(f"cannot make an interval from {type(x).__name__}")

    @abstractmethod
    def _exact(self, x):
        """The native value of an int or Python float: exact (a point) when the library holds it, else
        an enclosure."""

    @abstractmethod
    def interval(self, lo: Fraction, hi: Fraction):
        """An enclosure of every real in [lo, hi] (exact Fraction ends, lo <= hi)."""

    def lower(self, x) -> Fraction:
        """An exact rational <= every point of `x`; Rejected if `x` is not finite."""
        return self._endpoint(x, 0)

    def upper(self, x) -> Fraction:
        """An exact rational >= every point of `x`; Rejected if `x` is not finite."""
        return self._endpoint(x, 1)

    def abs_upper(self, x) -> Fraction:
        """An exact rational >= |v| for every point v of `x`; Rejected if `x` is not finite."""
        return max(-self.lower(x), self.upper(x))

    def fixed_ends(self, m: IMat, shift: int) -> tuple:
        """(lo, hi): lists of row lists of Python ints with lo <= 2^shift * v <= hi for every point v of
        each entry of `m` (shift >= 0): the floor and ceiling of its exact ends at that scale (flint: from
        Arb's mantissas, without a Fraction per entry); Rejected as `lower` / `upper` (not finite, beyond
        2^MAX_EXP)."""
        rows = m.rows()
        return ([[(self.lower(x) * (1 << shift)).__floor__() for x in row] for row in rows],
                [[(self.upper(x) * (1 << shift)).__ceil__() for x in row] for row in rows])

    def float_ends(self, m: IMat) -> tuple:
        """(lo, hi): float64 arrays of m's shape with lo <= every point of each entry <= hi: the float nearest to
        each exact end (`lower` / `upper`, clamped to +-the largest float; Python's float of a Fraction is
        correctly rounded) one step outward (np.nextafter, exact; infinite beyond the float range). Rejected as
        `lower` / `upper`."""
        near = lambda q: float(min(max(q, -FLOAT_MAX), FLOAT_MAX))
        return outward([[(near(self.lower(x)), near(self.upper(x))) for x in row] for row in m.rows()], m.shape)

    def exp_ends(self, m: IMat):
        """(lo, hi) as `float_ends`, of exp(m[r, j] - c_r) for every entry, c_r the largest upper end in row r (an
        exact point: a softmax's numerators, each at most 1), from one pass per row; None where the backend has
        no such pass or an entry or a result is not finite (the caller then builds them entry by entry, as
        `kinds.accuracy.tables.numerators`). Here: None."""
        return None

    @abstractmethod
    def _endpoint(self, x, which: int) -> Fraction:
        """The lower (which = 0) or upper (1) end of `x` as a bounded Fraction (`bounded_end`); Rejected if
        not finite."""

    # --- elementary functions: each returns an enclosure of f over every point of its argument --------
    @abstractmethod
    def exp(self, x):
        """Enclosure of exp over `x`."""

    @abstractmethod
    def log(self, x):
        """Enclosure of log over `x`; fails closed (non-finite or Rejected) where `x` reaches <= 0."""

    @abstractmethod
    def sqrt(self, x):
        """Enclosure of sqrt over `x`; fails closed (non-finite or Rejected) where `x` reaches below 0."""

    @abstractmethod
    def cos(self, x):
        """Enclosure of cos over `x`."""

    @abstractmethod
    def sin(self, x):
        """Enclosure of sin over `x`."""

    @abstractmethod
    def erf(self, x):
        """Enclosure of erf over `x`, with a proven error bound (not a library's unproven point value)."""

    @abstractmethod
    def tanh(self, x):
        """Enclosure of tanh over `x`."""

    @abstractmethod
    def pi(self):
        """Enclosure of pi."""

    def fsum(self, xs):
        """Enclosure of the sum of an iterable of interval scalars (0 when empty)."""
        total = self._exact(0)
        for x in xs:
            total = total + x
        return total

    def dot(self, xs, ys):
        """Enclosure of the inner product of two equal-length lists of interval scalars."""
        return (self.matrix([list(xs)]) @ self.matrix([[y] for y in ys])).rows()[0][0]

    # --- matrices ----------------------------------------------------------------------------------
    def array(self, a) -> IMat:
        """The exact matrix of a 1-D or 2-D numpy array of stored weights (a vector becomes a row)."""
        a = np.asarray(a)
        if a.ndim == 1:
            a = a[None, :]
        if a.dtype.kind != "f":
            a = a.astype(np.int64)
            return self._from_rows(a.tolist(), a.shape)
        ends = exact_backend.point_ends(a) if a.dtype in (np.float16, np.float32, np.float64) else None
        if ends is not None:
            return IMat(self, None, a.shape, ends)
        return self._from_rows(a.astype(np.float64).tolist(), a.shape)

    def matrix(self, rows) -> IMat:
        """A matrix from a non-empty list of equal-length lists of interval scalars."""
        shape = (len(rows), len(rows[0]) if rows else 0)
        return self._from_rows(rows, shape)

    @abstractmethod
    def centres(self, m: IMat) -> tuple:
        """(C, r): C a matrix of points (every entry exact) of m's shape, and for each row i an exact Fraction
        r[i] >= ||x - C[i]||_2 for every point x of the row's enclosure (an upper bound of the l2 norm of the
        row's entry radii); Rejected if an entry is not finite. (The rigorous forward pass re-centres its
        activations on C and carries r as error.)"""

    @abstractmethod
    def _from_rows(self, rows, shape) -> IMat:
        """The IMat of `shape` whose entries are `rows` (interval scalars, ints or exactly held floats)."""

    @abstractmethod
    def _from_ends(self, lo, hi):
        """The native matrix whose entries enclose [lo, hi] (ends: tuples of float64 arrays whose exact
        sums bound the entries; the same tuple twice for a point matrix, whose entries are then exact)."""

    @abstractmethod
    def _native_ends(self, data):
        """(lo, hi) ends (tuples of float64 parts, the same tuple twice for a point) bounding the native
        matrix `data` outward; ValueError when an entry is not finite."""

    def _native_ball(self, data):
        """((parts of the midpoints), radii): float64 arrays, the parts summing exactly to each entry's
        midpoint and the radii >= each entry's distance from it, for the exact layer's midpoint-radius
        products; None where the backend has no such form (then `_native_ends`)."""
        return None

    def _near_ball(self, data, parts: int = 2):
        """((parts), d): `parts` float64 arrays, their exact sum within d of every point of each entry of the
        native matrix `data` (for the exact layer's rotations); None where the backend has no such form."""
        return None

    # IMat hooks shared by both backends (their native matrices speak the same operators)
    def _matmul(self, a, b):
        """By the exact layer when it is switched on (`exact`), a factor is a point matrix and the
        precision is at most EXACT_MAX_PREC bits; else the library's product."""
        shape = (a.shape[0], b.shape[1])
        on = self.exact and self.prec <= EXACT_MAX_PREC
        ends = exact_backend.product(a, b, self) if on else None
        if ends is not None:
            return IMat(self, None, shape, ends)
        return self._native_matmul(a, b)

    def _native_matmul(self, a, b):
        """The library's own product of the native matrices."""
        return IMat(self, a.data * b.data, (a.shape[0], b.shape[1]))

    def _add(self, a, b):
        return IMat(self, a.data + b.data, a.shape)

    def _sub(self, a, b):
        return IMat(self, a.data - b.data, a.shape)

    def _scale(self, a, s):
        return IMat(self, a.data * s, a.shape)

    def _transpose(self, a):
        shape = (a.shape[1], a.shape[0])
        if a.ends is not None:
            return IMat(self, None, shape, exact_backend.transpose(a.ends))
        return IMat(self, a.data.transpose(), shape)

    def _rows(self, a):
        return a.data.tolist()

    def _col_bounds(self, m, groups):
        if m.ends is not None:
            return exact_backend.column_bounds(m.ends, groups)
        cols, size = m.T.rows(), m.shape[0] // groups
        return [([min(self.lower(x) for x in c[g * size:(g + 1) * size]) for c in cols],
                 [max(self.upper(x) for x in c[g * size:(g + 1) * size]) for c in cols]) for g in range(groups)]


def bounded_end(man: int, exp: int, which: int, prec: int) -> Fraction:
    """The endpoint man * 2^exp (exact ints) as a Fraction of bounded size, rounded outward (down for the
    lower end, which = 0; up for the upper end, which = 1): its mantissa cut to `prec` bits, a magnitude
    below 2^-MAX_EXP replaced by 0 or +-2^-MAX_EXP, one of 2^MAX_EXP or more Rejected (fail closed)."""
    if man == 0:
        return Fraction(0)
    cut = abs(man).bit_length() - prec
    if cut > 0:
        man, exp = shift_out(man, cut, which), exp + cut
    top = exp + abs(man).bit_length()     # 2^(top - 1) <= |value| <= 2^top
    require_magnitude(top)
    if top <= -MAX_EXP:   # |value| < 2^-MAX_EXP: the outward neighbour on the grid 0, +-2^-MAX_EXP
        return Fraction(0) if (man > 0) == (which == 0) else Fraction(1 if man > 0 else -1, 1 << MAX_EXP)
    return Fraction(man << exp) if exp >= 0 else Fraction(man, 1 << -exp)


def outward(ends, shape) -> tuple:
    """(lo, hi) float64 arrays of `shape` from (lower, upper) float pairs within one step of the exact ends
    (nearest, or clamped to +-FLOAT_MAX beyond it): each moved one step outward (np.nextafter, exact)."""
    a = np.array(ends, dtype=np.float64).reshape(tuple(shape) + (2,))
    with np.errstate(over="ignore"):            # +-FLOAT_MAX one step out: an infinity, as documented
        return np.nextafter(a[..., 0], -np.inf), np.nextafter(a[..., 1], np.inf)


def fixed_end(man: int, exp: int, which: int, shift: int) -> int:
    """floor (which = 0) or ceiling (1) of man * 2^(exp + shift), exact ints; Rejected as by `bounded_end`
    when |man 2^exp| reaches 2^MAX_EXP (so the result has at most MAX_EXP + shift bits)."""
    if man == 0:
        return 0
    require_magnitude(exp + abs(man).bit_length())
    k = exp + shift
    return man << k if k >= 0 else shift_out(man, -k, which)


def shift_out(man: int, cut: int, which: int) -> int:
    """floor (which = 0) or ceiling (1) of man / 2^cut for cut > 0 (Python's >> floors, any shift count)."""
    return man >> cut if which == 0 else -((-man) >> cut)


def require_magnitude(top: int) -> None:
    """Rejected (fail closed) when an endpoint's magnitude 2^top is beyond the bound on exact numbers."""
    if top > MAX_EXP:
        raise Rejected("finite enclosure", f"an interval endpoint of magnitude about 2^{top} is beyond the "
                                           f"bound 2^{MAX_EXP} on exact numbers")


def make_backend(name: str, prec: int = DEFAULT_PREC) -> Backend:
    """The backend called `name` at `prec` bits: "flint" (Arb, with the exact product layer for products
    with a point factor: the default) or "mpmath" (the reference: mpmath's own arithmetic throughout);
    a suffix "+exact" / "-exact" switches the exact layer on / off ("flint-exact": Arb's own products,
    "mpmath+exact"). docs/soundness.md, "Exact products on float hardware"."""
    exact, base = EXACT_DEFAULT.get(name), name
    for suffix, on in (("+exact", True), ("-exact", False)):
        if name.endswith(suffix):
            base, exact = name.removesuffix(suffix), on
    if base == "flint":
        from tcert.checker.flint_backend import FlintBackend
        return FlintBackend(prec, EXACT_DEFAULT[base] if exact is None else exact)
    if base == "mpmath":
        from tcert.checker.mpmath_backend import MpmathBackend
        return MpmathBackend(prec, EXACT_DEFAULT[base] if exact is None else exact)
    raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)}, each with +exact or -exact)")
