"""Error balls: how the rigorous forward pass carries activations, and the bound each step adds.

Why not plain intervals. Multiplying a vector of intervals by a point matrix W multiplies their radii
by the column sums of |W| (every coordinate's error aligned the worst way at once), while the exact
function moves by at most ||W||_2 times the input's error: on a 768-wide model that is a factor ~20
per product and ~2^30 per block, so 64 bits were gone after two blocks. Here each activation row is
instead

    an exact point c (the row's centre, a point of the backend)  and  an l2 radius eps (a Fraction),

meaning: the exact real-number row x of the model's function satisfies ||x - c||_2 <= eps. A step
computes its output at the centre with interval arithmetic (point inputs, so the enclosure is only
rounding-wide), takes the midpoints of that enclosure as the new centre (`recentre`, the rounding
radius joins eps), and bounds how far the exact output can be from the exact image of the centre by
the step's Lipschitz constant on the ball: ||W||_2 for a product (`linear`), max|w| / sigma_lo for a
LayerNorm (`normalise`), the activation's Lipschitz constant (`nonlinear`), score and softmax
perturbation bounds for attention (`head_output`). The error grows per block by the block's worst-case
Lipschitz constant instead of by the product of the matrices' column sums.

Every radius is an exact Fraction rounded *up* to BITS significant bits (`up`); square roots of
Fractions are integer square roots rounded outward (`sqrt_up`, `sqrt_down`). Nothing here compares
floats; a verdict reads `lower`/`upper` of enclosures built from these centres and radii.
"""

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from tcert.checker import exact_backend, exact_products, exact_rounding
from tcert.checker.interval import EXACT_MAX_PREC, Backend, IMat, make_backend

BITS = 40          # significant bits kept by up(): radii are upper bounds, 2^-40 relative slack each
EXP_LIMIT = 40     # score perturbations above this use the convex-hull cap (e^(2 delta) is useless there)


def up(x: Fraction) -> Fraction:
    """A dyadic rational >= x with at most BITS significant bits (x itself when x <= 0)."""
    return _up_int(x.numerator, x.denominator)


def _up_int(n: int, d: int) -> Fraction:
    """up(n / d) = ceil(x 2^s) / 2^s, s = BITS - (bit length of n - that of d), in integers. Its value is the
    same for any n / d equal to x up to a common power of two (neither the value nor the bit-length
    difference changes), so `up_affine` may pass unreduced dyadics."""
    if n <= 0:
        return Fraction(n, d)
    shift = BITS - (n.bit_length() - d.bit_length())
    return Fraction(-(-(n << shift) // d), 1 << shift) if shift >= 0 else Fraction(-(-n // (d << -shift)) << -shift)


def sqrt_up(x: Fraction) -> Fraction:
    """A rational >= sqrt(x), within 2^-(BITS-1) relative, for x >= 0."""
    return Fraction(*_sqrt_int(x.numerator, x.denominator, 1))


def sqrt_down(x: Fraction) -> Fraction:
    """A rational in [0, sqrt(x)], within 2^-(BITS-1) relative, for x >= 0."""
    return Fraction(*_sqrt_int(x.numerator, x.denominator, 0))


def _sqrt_int(n: int, d: int, upward: int) -> tuple:
    """(r, 2^k): sqrt(x) (x = n / d) rounded down (upward 0) or up (1) to r / 2^k: with x 4^k between integers
    N- <= x 4^k <= N+, isqrt(N-) / 2^k <= sqrt(x) <= ceil(sqrt(N+)) / 2^k. As `_up_int`, the same for any n / d
    equal to x up to a common power of two."""
    if n <= 0:
        return 0, 1
    k = max(0, BITS - (n.bit_length() - d.bit_length()) // 2)
    if not upward:
        return math.isqrt((n << 2 * k) // d), 1 << k
    m = -(-(n << 2 * k) // d)
    r = math.isqrt(m)
    return (r if r * r == m else r + 1), 1 << k


def _dyadic(x: Fraction):
    """(n, t) with x = n / 2^t when x's denominator is a power of two, else None."""
    d = x.denominator
    return (x.numerator, d.bit_length() - 1) if d & (d - 1) == 0 else None


def up_affine(xs: list, ys: list, a: Fraction = Fraction(1), c: Fraction = Fraction(0), split=None) -> list:
    """[up(a x + y + c) for x, y in zip(xs, ys)], the same values, in integers where every term is dyadic
    (`split`: the lists [_dyadic(x)], [_dyadic(y)] when the caller has them, e.g. for several a)."""
    fixed, out = [_dyadic(Fraction(v)) for v in (a, c)], []
    for x, y, dx, dy in zip(xs, ys, *(split or ([_dyadic(x) for x in xs], [_dyadic(y) for y in ys]))):
        if None in (dx, dy, *fixed):
            out.append(up(a * x + y + c))
            continue
        (an, at), (cn, ct) = fixed
        t = max(at + dx[1], dy[1], ct)
        out.append(_up_int(((an * dx[0]) << (t - at - dx[1])) + (dy[0] << (t - dy[1])) + (cn << (t - ct)), 1 << t))
    return out


def sqrt_sum_up(pairs: list) -> list:
    """[sqrt_up(a) + sqrt_up(b) for a, b in pairs], the same values, in integers where a and b are dyadic."""
    out = []
    for a, b in pairs:
        da, db = (_dyadic(v if isinstance(v, (int, Fraction)) else Fraction(v)) for v in (a, b))   # no copies
        if da is None or db is None:
            out.append(sqrt_up(a) + sqrt_up(b))
            continue
        (ra, ka), (rb, kb) = _sqrt_int(da[0], 1 << da[1], 1), _sqrt_int(db[0], 1 << db[1], 1)
        k = max(ka, kb)
        out.append(Fraction(ra * (k // ka) + rb * (k // kb), k))
    return out


class Rows(NamedTuple):
    """Activation rows as error balls: the exact row i lies within l2 distance eps[i] of centre row i
    (`centre` holds points only)."""

    centre: IMat
    eps: list


def recentre(B: Backend, Y: IMat, eps: list) -> Rows:
    """Rows whose exact values lie in the enclosures Y widened by l2 radii eps: re-centred on Y's midpoints,
    each row's radius grows by the l2 norm of its entries' radii (triangle inequality)."""
    if exact_backend.is_point(Y):      # stored weights: exact points already (what `centres` would give)
        return Rows(Y, [up(e) for e in eps])
    C, radius = B.centres(Y)
    return Rows(C, [up(e + r) for e, r in zip(eps, radius)])


def exact_rows(B: Backend, Y: IMat) -> Rows:
    """Rows whose exact values lie in the enclosures Y (no error carried yet)."""
    return recentre(B, Y, [Fraction(0)] * Y.shape[0])


def take(B: Backend, X: Rows, rows: list) -> Rows:
    """The rows with the given indices (a row may repeat; no arithmetic)."""
    if list(rows) == list(range(X.centre.shape[0])):
        return X
    eps = [X.eps[i] for i in rows]
    if X.centre.ends is not None:
        lo, hi = (tuple(p[list(rows)] for p in e) for e in X.centre.ends)
        return Rows(IMat(B, None, (len(eps), X.centre.shape[1]), (lo, lo if X.centre.ends[0] is X.centre.ends[1] else hi)), eps)
    data = X.centre.data
    return Rows(B.matrix([[data[i, j] for j in range(X.centre.shape[1])] for i in rows]), eps)


def stack(B: Backend, balls: list) -> Rows:
    """The rows of several error balls (same width) one after another (no arithmetic)."""
    eps, parts = sum((list(x.eps) for x in balls), []), [exact_backend.multi_point(x.centre) for x in balls]
    if all(p is not None and len(p) == len(parts[0]) for p in parts):
        joined = tuple(np.vstack([p[i] for p in parts]) for i in range(len(parts[0])))
        return Rows(IMat(B, None, (len(eps), joined[0].shape[1]), (joined, joined)), eps)
    return Rows(B.matrix(sum((x.centre.rows() for x in balls), [])), eps)


def add(B: Backend, *terms: Rows) -> Rows:
    """The sum of error balls (same shape): centres added, radii add (triangle inequality)."""
    total = terms[0].centre
    for t in terms[1:]:
        total = total + t.centre
    return recentre(B, total, [sum(es) for es in zip(*(t.eps for t in terms))])


def with_bias(B: Backend, Y: IMat, bias):
    """Y with the row vector `bias` (a list of enclosures, or None for no bias) added to every row."""
    return Y if bias is None else Y + B.matrix([bias] * Y.shape[0])


def linear(B: Backend, X: Rows, W: IMat, norm: Fraction, bias=None) -> Rows:
    """x @ W + b for each row, W a point matrix with ||W||_2 <= norm: ||(x - c) W||_2 <= norm ||x - c||_2."""
    return recentre(B, with_bias(B, X.centre @ W, bias), [norm * e for e in X.eps])


def linear_heads(B: Backend, X: Rows, W: IMat, norms: list, bias=None) -> list:
    """x @ W_h + b_h for every head h at once, the heads' point matrices side by side in W (W_h are
    columns h*dh..(h+1)*dh-1), ||W_h||_2 <= norms[h]: one product, one error ball per head."""
    C, radius = B.centres(with_bias(B, X.centre @ W, bias))
    dh, rows = W.shape[1] // len(norms), C.rows()
    return [Rows(B.matrix([r[h * dh:(h + 1) * dh] for r in rows]),
                 [up(n * e + r) for e, r in zip(X.eps, radius)]) for h, n in enumerate(norms)]


WORD_PREC = 48     # at working precisions up to this, a centre is the high word of its exact value (~61 bits)


def trimmed_centre(x, prec: int, uniform: bool = False):
    """(parts, radii): a centre of the exact point product x (an Exact; None gives None) as two float64 parts and
    per row an upper bound of the row's distance from it; with `uniform`, one radius for every row. At working
    precision prec <= WORD_PREC the high word of x (`split_centre` with `word`: ~61 bits, 13 or more beyond the
    precision) and the square roots of its bounds; above, `split_centre`'s ~105-bit centre cut to TRIM_BELOW bits
    (`exact_rounding.trimmed`; uniform: `uniform_radius`). None where a part would leave the float range."""
    split = None if x is None else exact_rounding.split_centre(x, prec <= WORD_PREC)
    if split is None:
        return None
    if prec <= WORD_PREC:
        parts, sq = split
        if uniform:
            return parts, [sqrt_up(largest(sq))] * len(sq) if sq else []
        roots = {i: sqrt_up(s) for i, s in {id(s): s for s in sq}.items()}   # one per distinct bound (`split_centre`)
        return parts, [roots[id(s)] for s in sq]
    parts, pairs = exact_rounding.trimmed(*split, exact_rounding.TRIM_BELOW, uniform)
    # uniform: `trimmed` gave one pair bounding every row's, so [R] * m, one radius for each of the m rows
    return parts, (uniform_radius(pairs) * parts[0].shape[0] if uniform and pairs else sqrt_sum_up(pairs))


def uniform_radius(pairs: list) -> list:
    """[R] * len(pairs) with R = sqrt_up(max a) + sqrt_up(max b) >= sqrt(a_i) + sqrt(b_i) for every pair (a_i, b_i)
    of rationals >= 0 (sqrt is increasing and sqrt_up(x) >= sqrt(x)): one bound for all rows, two square roots
    instead of one pair per row, for rows whose radii are only used through their maximum (keys and values:
    `head_output` reads max(k.eps), max(v.eps))."""
    if not pairs:
        return []
    r = sqrt_up(largest([a for a, _ in pairs])) + sqrt_up(largest([b for _, b in pairs]))
    return [r] * len(pairs)


def exact_affine(B: Backend, X: Rows, Wb: IMat, norms: list, uniform: bool = False):
    """x @ W_h + b_h for every column block h of Wb = [W; b] (the bias as its last row; len(norms) equal
    blocks, ||W_h||_2 <= norms[h]) by the exact layer, when it is on and X's centres are points: the
    product is exact, its centre two float64 parts held as ends (no native entry is made) and its
    rounding radius exact (`exact_backend.affine_exact`, `trimmed_centre`); then as `linear_heads`. With `uniform`, every
    row of head h gets the one radius up(norms[h] max_i e_i + R) >= up(norms[h] e_i + r_i) (R >= every
    rounding radius r_i: `uniform_radius`; up is increasing), a larger radius is still a true one. None
    where the layer does not apply (the caller computes as `linear_heads`)."""
    if not (B.exact and B.prec <= EXACT_MAX_PREC):
        return None
    out = trimmed_centre(exact_backend.affine_exact(X.centre, Wb, B), B.prec, uniform)
    if out is None:
        return None
    (c1, c2), radius = out
    dh, m = c1.shape[1] // len(norms), c1.shape[0]
    if uniform:
        e = largest(X.eps) if X.eps else Fraction(0)
        eps = [[up(n * e + radius[0])] * m if m else [] for n in norms]
    else:
        split = ([_dyadic(x) for x in X.eps], [_dyadic(y) for y in radius])
        eps = [up_affine(X.eps, radius, n, split=split) for n in norms]
    heads = []
    for h in range(len(norms)):
        part = (c1[:, h * dh:(h + 1) * dh], c2[:, h * dh:(h + 1) * dh])
        heads.append(Rows(IMat(B, None, (m, dh), (part, part)), eps[h]))
    return heads


def nonlinear(B: Backend, X: Rows, fn, lipschitz: Fraction) -> Rows:
    """fn applied entrywise, fn Lipschitz with constant `lipschitz`: ||fn(x) - fn(c)||_2 <= L ||x - c||_2
    coordinate by coordinate, hence in l2."""
    return recentre(B, X.centre.map(fn), [lipschitz * e for e in X.eps])


def gated(B: Backend, G: Rows, U: Rows, fn, lipschitz: Fraction, bias=None) -> Rows:
    """fn(g) * u + b entrywise (a gated MLP's hidden layer), g and u error balls of the same rows, fn
    Lipschitz with constant L.

    Bound. With a = fn(g), a^ = fn(g^) for the centres g^, u^: a u - a^ u^ = (a - a^) u^ + a^ (u - u^) +
    (a - a^)(u - u^) entrywise, so in l2 the error is <= max|u^| L e_g + max|a^| e_u + L e_g e_u
    (||x * y||_2 <= ||x||_2 max|y| and max|y| <= ||y||_2), max|a^| read from the enclosure of fn(g^)."""
    A = G.centre.map(fn)
    a_rows, u_rows, errs, out = A.rows(), U.centre.rows(), [], []
    for a_row, u_row, eg, eu in zip(a_rows, u_rows, G.eps, U.eps):
        prod = [a * u for a, u in zip(a_row, u_row)]
        out.append(prod if bias is None else [x + b for x, b in zip(prod, bias)])
        a_max = max(max(B.upper(a), -B.lower(a)) for a in a_row)
        u_max = max(max(B.upper(u), -B.lower(u)) for u in u_row)
        errs.append(u_max * lipschitz * eg + a_max * eu + lipschitz * eg * eu)
    return recentre(B, B.matrix(out), errs)


def normalise(B: Backend, X: Rows, w, b, eps: Fraction, w_max: Fraction, centred: bool = True) -> Rows:
    """LayerNorm (centred) or RMSNorm of each row: y = w * f(Px) + b, f(u) = u / sqrt(||u||^2/d + eps),
    P the centring projection (the identity for RMSNorm), w None for no gain and bias, b None for no bias,
    |w_i| <= w_max.

    Bound. f's Jacobian (1/s)(I - u u^T/(d s^2)), s = sqrt(||u||^2/d + eps), is symmetric with eigenvalues
    1/s (on u's orthogonal complement) and eps/s^3 <= 1/s, so ||f'(u)||_2 = 1/s(u). Every u on the segment
    from Pc to Px has ||u|| >= ||Pc|| - ||P(x - c)|| >= ||Pc|| - e (||P||_2 <= 1), so
    s >= sigma_lo = sqrt(max(0, ||Pc|| - e)^2/d + eps) and ||y(x) - y(c)|| <= w_max e / sigma_lo. Also
    ||f(u)|| < sqrt(d) for every u, so the change is at most 2 sqrt(d) w_max whatever e is."""
    d = X.centre.shape[1]
    cap, out, errs, ones = 2 * sqrt_up(Fraction(d)) * w_max, [], [], [B.num(1)] * d
    for row, e in zip(X.centre.rows(), X.eps):
        mean = B.dot(row, ones) / d
        u = [x - mean for x in row] if centred else row
        sq = B.dot(u, u)
        inv = 1 / B.sqrt(sq / d + B.num(eps))
        if w is None:
            out.append([x * inv for x in u])
        else:
            out.append([x * inv * wi for x, wi in zip(u, w)] if b is None else
                       [x * inv * wi + bi for x, wi, bi in zip(u, w, b)])
        gap = max(sqrt_down(max(B.lower(sq), Fraction(0))) - e, Fraction(0))
        sigma_lo = sqrt_down(gap * gap / d + eps)
        errs.append(min(w_max * e / sigma_lo, cap) if e else Fraction(0))
    return recentre(B, B.matrix(out), errs)


ONE_PART_PREC = 48   # at working precisions up to this, a transcendental factor enters as one float64 part


def near_parts(B: Backend, data, prec: int):
    """B's `_near_ball` of the native matrix `data`, ((p1, ...), d) with |x - sum of parts| <= d for every point x
    of each entry: one float64 part where the working precision `prec` is at most ONE_PART_PREC (its 53 bits are
    ~2^-5 of that precision's roundings; one part has fewer digits to multiply), else two; None where the backend
    gives none."""
    return B._near_ball(data, 1 if prec <= ONE_PART_PREC else 2)


def exact_normalise(B: Backend, X: Rows, w, b, eps: Fraction, w_max: Fraction, centring: bool) -> Rows | None:
    """`normalise` by the exact layer, when it is on and X's centres are points: w, b float64 rows (None:
    none), `centring` False for RMSNorm. None where the layer does not apply.

    Centre. v = c (d I - 11^T) = d P c (k = d; RMSNorm: v = c, k = 1) is exact (`exact_products.centred`), kept as two
    float64 parts v^ with ||v - v^|| <= rho; ||v^||^2 is exact (`exact_products.row_squares`); so
    f(u^) for u^ = v^ / k is v^ inv with inv = 1 / sqrt(||v^||^2 / d + k^2 eps), enclosed by the backend
    (one scalar per row, at twice the precision) and taken as float64 parts iota (|inv - iota| <= delta:
    `_near_ball`). The new centre w * v^ iota + b is exact (`entrywise`, b added as one more
    term: `plus_row`; or b a third part), as two parts.
    Bound. ||Px - u^|| <= e + rho / k =: e' for x within e of c, so as in `normalise` ||y(x) - y(u^)|| <=
    min(w_max e' / sigma_lo, 2 sqrt(d) w_max) with sigma_lo from ||u^|| >= sqrt(||v^||^2) / k; and
    ||w * v^ (inv - iota)|| <= w_max ||v^|| delta, plus the exact rounding radius of the new centre."""
    if not (B.exact and B.prec <= EXACT_MAX_PREC):
        return None
    c = exact_backend.point_parts(X.centre, B)
    if c is None:
        return None
    m, d = X.centre.shape
    if not centring:
        v, k, rho = c, 1, [Fraction(0)] * m
    else:
        k = d
        out = trimmed_centre(exact_products.centred(c), B.prec)
        if out is None:
            return None
        v, rho = out
    sq = exact_products.row_squares(v)
    fine = make_backend(B.name, 2 * B.prec)     # one scalar per row: its width then adds nothing that matters
    with fine.precision():
        ball = near_parts(fine, fine.matrix([[1 / fine.sqrt(fine.num(s / d + k * k * eps))] for s in sq]).data, B.prec)
    if ball is None:
        return None
    iota, delta = ball
    scaled = exact_products.entrywise([v, iota], [] if w is None else [(w,)])
    folded = None if b is None else exact_products.plus_row(scaled, b)     # b inside the two parts
    t = trimmed_centre(folded or scaled, B.prec)
    if t is None:
        return None
    (t1, t2), rounding = t
    errs = normalise_radii(X.eps, rho, sq, delta[:, 0].tolist(), rounding, (k, d, w_max, eps))
    parts = (t1, t2) if b is None or folded is not None else (t1, t2, np.broadcast_to(b, (m, d)))
    return Rows(IMat(B, None, (m, d), (parts, parts)), errs)


def normalise_radii(eps_in, rho, sq, delta, rounding, shape) -> list:
    """`exact_normalise`'s per-row radius (its docstring's Bound): with e' = e + rho / k and sigma_lo from
    sqrt(||v^||^2) / k - e', min(w_max e' / sigma_lo, 2 sqrt(d) w_max) + w_max ||v^|| delta + the rounding, up.
    The same rationals as Fractions would give, in Python integers (numerators and denominators, not reduced: no
    gcd per operation); the square roots rounded outward by `_sqrt_int` and the sum rounded up by `_up_int`,
    which take any numerator-denominator pair of a value (their last bits may differ from the reduced pair's,
    by at most 2^-(BITS-1) relative, and stay bounds in the same direction)."""
    k, d, w_max, eps = shape
    cap = 2 * sqrt_up(Fraction(d)) * w_max
    consts = (k, d, (w_max.numerator, w_max.denominator), (cap.numerator, cap.denominator),
              (eps.numerator, eps.denominator))
    errs = []
    for e, r, s, dl, rd in zip(eps_in, rho, sq, delta, rounding):
        e1 = (e.numerator * r.denominator * k + r.numerator * e.denominator, e.denominator * r.denominator * k)
        ln, ld = _lip_int(e1, s, consts)
        an, ad = _sqrt_int(s.numerator, s.denominator, 1)          # ||v^|| <= an / ad
        m, q = Fraction(dl).as_integer_ratio()
        tn, td, rn, rdd = w_max.numerator * an * m, w_max.denominator * ad * q, rd.numerator, rd.denominator
        errs.append(_up_int(ln * td * rdd + tn * ld * rdd + rn * ld * td, ld * td * rdd))
    return errs


def _lip_int(e1: tuple, s: Fraction, consts) -> tuple:
    """(n, d) with n / d = min(w_max e' / sigma_lo, cap) for e' = e1[0] / e1[1] (0 when e' = 0; cap when sigma_lo is
    0), sigma_lo = sqrt_down(gap^2 / d + eps) and gap = max(sqrt_down(s) / k - e', 0): `normalise_radii`'s first
    term, in integers."""
    k, d, (wn, wd), (cn, cd), (en, ed) = consts
    e1n, e1d = e1
    if not e1n:
        return 0, 1
    b, bk = _sqrt_int(s.numerator, s.denominator, 0)                # sqrt(s) >= b / bk
    gn, gd = max(b * e1d - e1n * bk * k, 0), bk * k * e1d          # gap = gn / gd
    c, ck = _sqrt_int(gn * gn * ed + en * gd * gd * d, gd * gd * d * ed, 0)     # sigma_lo = c / ck
    ln, ld = wn * e1n * ck, wd * e1d * c
    return (cn, cd) if c == 0 or ln * cd > cn * ld else (ln, ld)


class Rotation(NamedTuple):
    """Rotary rotations of the rows at some positions for the exact layer: out = x * C + x[:, swap] * S
    entrywise, C and S (float64 parts, m x d_head) the midpoints of the cos and -sin / sin enclosures
    on each pair's two columns (1 and 0 on columns no pair rotates), delta >= the spectral norm of every
    row's exact rotation minus this one: a pair's difference [[a, -b], [b, a]] has norm sqrt(a^2 + b^2) <=
    sqrt(dc^2 + ds^2), dc and ds the largest cos and sin radii over all rows and pairs (one bound for all rows:
    a subset of the rows keeps it)."""

    cos: tuple
    sin: tuple
    swap: list
    delta: Fraction


def rotation(B: Backend, big: tuple, small: tuple, at: tuple, pairs: list, d_head: int, prec: int = 64):
    """The `Rotation` of rows whose pair j turns by alpha_(a_i, j) + beta_(b_i, j) (row i; (a, b) = `at`, index
    arrays), from cos and sin enclosures of the alphas (`big`: two matrices of B, a row per a and a column per
    pair) and of the betas (`small`), e.g. `forward.rotary_factors` at a raised precision, for a pass at working
    precision `prec`; None where `_near_ball` gives no float64 parts.

    Each enclosure enters as two float64 parts within d of every point of it (`_near_ball`; d the largest of
    its table), and cos(alpha + beta) = cA cB - sA sB, sin(alpha + beta) = sA cB + cA sB are computed exactly on
    the parts (`_table`): as |cos|, |sin| <= 1 and the parts of cA lie within dA of it, |cA cB - CA CB| <= dA +
    (1 + dA) dB, and so for each of the four products."""
    if not pairs:
        return None
    balls = [B._near_ball(t.data, 2) for t in big + small]
    if any(x is None for x in balls):
        return None
    (ca, sa, cb, sb), (dca, dsa, dcb, dsb) = zip(*[(tuple(p[i] for p in parts), Fraction(float(d.max(initial=0.0))))
                                                   for (parts, d), i in zip(balls, (at[0], at[0], at[1], at[1]))])
    cos = _table([([ca, cb], []), ([tuple(-p for p in sa), sb], [])], prec)
    sin = _table([([sa, cb], []), ([ca, sb], [])], prec)
    if cos is None or sin is None:
        return None
    dc = dca + (1 + dca) * dcb + dsa + (1 + dsa) * dsb + cos[1]
    ds = dsa + (1 + dsa) * dcb + dca + (1 + dca) * dsb + sin[1]
    return _rotation(cos[0], sin[0], pairs, d_head, sqrt_up(dc * dc + ds * ds))


def _table(products: list, prec: int):
    """(parts, w): the exact sum of the entrywise `products` (`exact_products.entrywise_sum`) as float64 parts and
    an exact w >= every entry's distance from their sum; None where a part would leave the float range. The sum
    leaves as `exact_rounding.split_centre`'s two parts c1 + c2, within sqrt(sq_i) of row i's exact values (each
    entry's distance is at most its row's l2 distance): w = sqrt_up(max sq). At prec <= ONE_PART_PREC, one part:
    with u = nextafter(c1) - c1 (adjacent floats: an exact power of two) and 0 <= c2 < u (c1 the float64 floor), c1
    when c2 < u / 2, else
    c1 + u (the next float), within c2 or u - c2 of c1 + c2 (exact: Sterbenz, u / 2 <= c2 <= u), which joins w."""
    split = exact_rounding.split_centre(exact_products.entrywise_sum(products))
    if split is None:
        return None
    (c1, c2), sq = split
    width = sqrt_up(largest(sq)) if sq else Fraction(0)
    if prec > ONE_PART_PREC:
        return (c1, c2), width
    u = np.nextafter(c1, np.inf) - c1
    bump = c2 >= u / 2
    err = np.where(bump, u - c2, c2)
    return (np.where(bump, c1 + u, c1),), width + Fraction(float(err.max(initial=0.0)))


def _rotation(cm: tuple, sm: tuple, pairs: list, d_head: int, delta: Fraction) -> Rotation:
    """The `Rotation` with cos and sin tables of float64 parts cm, sm (a row per row, a column per pair)."""
    m, swap = cm[0].shape[0], list(range(d_head))
    C, S = [np.zeros((m, d_head)) for _ in cm], [np.zeros((m, d_head)) for _ in sm]
    C[0][:] = 1.0
    for j, (i1, i2) in enumerate(pairs):
        swap[i1], swap[i2] = i2, i1
        for q, (a, b) in enumerate(zip(cm, sm)):      # as many parts in each (`_table`)
            C[q][:, i1], C[q][:, i2] = a[:, j], a[:, j]
            S[q][:, i1], S[q][:, i2] = -b[:, j], b[:, j]
    return Rotation(tuple(C), tuple(S), swap, delta)


def rotation_rows(rot: Rotation, rows: list) -> Rotation:
    """The rotations of the given rows of `rot` (no arithmetic)."""
    return Rotation(tuple(p[rows] for p in rot.cos), tuple(p[rows] for p in rot.sin), rot.swap, rot.delta)


def rotation_cuts(rot: Rotation) -> tuple:
    """`rot`'s cos and sin tables cut once (`exact_products.line_cut`, on their common scale per row) as the
    second factors of `exact_rotate`'s two entrywise products, for every head it rotates."""
    bits = exact_products.entry_bits(2)
    top = exact_products.line_top(list(rot.cos) + list(rot.sin), 0)
    return tuple(exact_products.line_cut(t, 0, bits, top) for t in (rot.cos, rot.sin))


def exact_rotate(B: Backend, X: Rows, rot: Rotation, uniform: bool = False, tables: tuple | None = None) -> Rows | None:
    """Each row through its exact rotary rotation R (an isometry), by the exact layer, when it is on and X's
    centres are points: the new centre is R^ c (R^ the rotation by the midpoints `rot`, exact by `entrywise_sum`
    of c * C + c[:, swap] * S, c cut once and its digits permuted for c[:, swap], `exact_products.permuted`; C and S
    cut by `rotation_cuts`, or given as `tables`)
    to two float64 parts, so ||R x - c'|| <= e + ||(R - R^) c|| + rounding <= e + delta ||c|| + rounding, with
    ||c_i|| <= sqrt(n) max_j |c_ij| <= sqrt(n) sum_parts max |part| (delta, at twice the precision, is ~2^-120:
    this term is far below the rounding's). With `uniform`, every row gets up(max_i e_i + R + that term), R >=
    every row's rounding radius (`uniform_radius`), >= each row's own. None where the layer does not apply."""
    c = exact_backend.point_parts(X.centre, B) if B.exact and B.prec <= EXACT_MAX_PREC else None
    if c is None:
        return None
    cos, sin = tables or rotation_cuts(rot)
    own = exact_products.line_cut(c, 0, exact_products.entry_bits(2))
    products = [([own, cos], []), ([exact_products.permuted(own, rot.swap), sin], [])]
    out = trimmed_centre(exact_products.entrywise_sum(products), B.prec, uniform)
    if out is None:
        return None
    parts, rounding = out
    peak = sum((Fraction(float(np.abs(p).max(initial=0.0))) for p in c), Fraction(0))
    turn = up(rot.delta * sqrt_up(Fraction(c[0].shape[1])) * peak)
    if uniform and X.eps:
        eps = [up(largest(X.eps) + rounding[0] + turn)] * len(X.eps)
    else:
        eps = up_affine(X.eps, rounding, c=turn)
    return Rows(IMat(B, None, X.centre.shape, (parts, parts)), eps)


def rotate_rows(B: Backend, X: Rows, rotate_row) -> Rows:
    """Each row i through the exact rotation rotate_row(i, row) (an isometry): the radii are unchanged; the
    rotation's enclosure (its cos/sin are enclosures) adds only rounding."""
    return recentre(B, B.matrix([rotate_row(i, row) for i, row in enumerate(X.centre.rows())]), X.eps)


def row_sq_norms(B: Backend, M: IMat) -> list:
    """Enclosures of ||row||_2^2 for each row of M (dot products: one rounding each, not one per term; exact
    sums of squares when M is a point held as float64 parts)."""
    parts = exact_backend.multi_point(M)
    if parts is not None and B.exact:
        return [B.num(x) for x in exact_products.row_squares(parts)]
    return [B.dot(row, row) for row in M.rows()]


def row_sq_max(B: Backend, M: IMat) -> Fraction:
    """An exact rational >= max_i ||row i||_2^2 of M (cached): the largest of `row_sq_uppers`, compared as
    integers where they are the grid bounds of float64 parts (`exact_products.row_square_bounds`)."""
    key = ("row_sq_max", B.name, B.prec)
    if key not in M.cuts:
        parts = exact_backend.multi_point(M)
        if parts is not None and B.exact and M.shape[0]:
            sums, exps = _square_sums(M, parts)
            low = min(exps)
            top = max(v << (e - low) for v, e in zip(sums, exps))
            M.cuts[key] = exact_products.dyadic(top, low)
        else:
            M.cuts[key] = max(row_sq_uppers(B, M)[0], default=Fraction(0))
    return M.cuts[key]


def _square_sums(M: IMat, parts) -> tuple:
    """`exact_products.row_square_bounds` of M's parts, cached on M."""
    if "square sums" not in M.cuts:
        M.cuts["square sums"] = exact_products.row_square_bounds(parts)
    return M.cuts["square sums"]


def row_sq_uppers(B: Backend, M: IMat) -> tuple:
    """(u, enc): exact rationals u_i >= ||row i||_2^2 of M -- where M is a point held as float64 parts, sums of
    squares of its magnitudes rounded up onto a grid of about 2^-24 of each row's top (`exact_products.
    row_square_bounds`; enc None: no enclosure made), else the upper ends of the enclosures enc (`row_sq_norms`)."""
    key = ("row_sq", B.name, B.prec)       # cached: one matrix may be every head's values (`forward.mixed_values`)
    if key not in M.cuts:
        parts = exact_backend.multi_point(M)
        if parts is not None and B.exact:
            sums, exps = _square_sums(M, parts)
            M.cuts[key] = [exact_products.dyadic(v, e) for v, e in zip(sums, exps)], None
        else:
            enc = row_sq_norms(B, M)
            M.cuts[key] = [B.upper(x) for x in enc], enc
    return M.cuts[key]


def softmax(B: Backend, scores: list, shift: Fraction | None = None) -> list:
    """Enclosures of softmax(scores); shifting by a constant does not change the exact value (any rational
    `shift`, e.g. one bound for several rows; default the largest upper end, against overflow)."""
    shift = B.num(max(B.upper(s) for s in scores) if shift is None else shift)
    e = [B.exp(s - shift) for s in scores]
    total = B.dot(e, [B.num(1)] * len(e))
    return [x / total for x in e]


def head_output(B: Backend, q: Rows, k: Rows, v: Rows, div, visible: list, fine: Backend | None = None) -> Rows:
    """One attention head: z_i = sum_(r < visible[i]) a_ir v_r, a_i = softmax_r(q_i . k_r / div), as error
    balls, from error balls of its queries q, keys k and values v (div > 0 an enclosure). With `fine` (a
    backend at a higher precision, used where the exact layer is on: `fine_heads`), the scores leave their
    exact product at that precision and the softmax, P V and the bounds run there; the centre leaves as two
    float64 parts (`_near_ball`, its distance joining the radius), so the 64-bit roundings of softmax and P V
    no longer dominate the keys' and values' radii.

    Bound. Scores: with q = q^ + dq, k = k^ + dk, |q.k - q^.k^| <= |dq| |k^| + |q^| |dk| + |dq| |dk|, so every
    exact score of row i is within delta_i = (eq_i max|k^| + (|q^_i| + eq_i) max ek) / div + (the score
    enclosure's radius) of the point score s^ used for the pattern. Values: sum_r a_r v_r =
    sum_r a_r v^_r + sum_r a_r (v_r - v^_r), the second part within max ev (a is a convex combination).
    Softmax, for z(s) = sum_r softmax(s)_r v^_r and a = softmax(s^): (ratio) a'_r / a_r lies in
    [e^(-2 delta), e^(2 delta)], so |z(s) - z(s^)| <= (e^(2 delta) - 1) max|v^_r|; (mean value) dz/dt along
    s^ + t(s - s^) is sum_r a_r(t) d_r (v^_r - z(t)), of norm <= delta sqrt(sum_r a_r(t) |v^_r - z(t)|^2)
    <= delta sqrt(sum_r a_r(t) |v^_r - c|^2) for any c (the weighted mean minimises it) <= delta e^delta
    sqrt(sum_r a_r |v^_r - c|^2) (a_r(t) <= e^(2 delta) a_r), with c the new centre; and (hull) z(s) and
    the centre differ by at most max_r |v^_r - c|. The smallest of these is used."""
    return head_outputs(B, [q], [k], v, div, visible, fine)[0]


def head_outputs(B: Backend, qs: list, ks: list, v: Rows, div, visible: list, fine: Backend | None = None) -> list:
    """`head_output` for several heads (queries qs[h], keys ks[h], the same rows `visible`) whose values are the
    same rows v: the heads' patterns stacked, so that one product P V serves them all (`forward.mixed_values`:
    every head mixes the normalised rows); each row's bound is `head_output`'s, row by row."""
    F, ev, m = fine or B, largest(v.eps), len(visible)
    v_up, v_sq = row_sq_uppers(B, v.centre)
    v_max = sqrt_up(row_sq_max(B, v.centre))
    scores = [q.centre @ k.centre.T for q, k in zip(qs, ks)]
    with F.precision():
        rows, deltas = [], []
        for q, k, sc in zip(qs, ks, scores):
            P, delta = pattern(B, F, q, k, sc, div, visible)
            rows, deltas = rows + P, deltas + delta
        P = F.matrix(rows)
        Z = pattern_times_values(F, P, v.centre) if fine is not None else P @ v.centre
        C, z_rad = F.centres(Z)
        spread_terms = (P @ F.matrix([[x] for x in v_sq] if v_sq else [[F.num(x)] for x in v_up])).rows()
        errs = []
        for i, (c, z) in enumerate(zip(C.rows(), Z.rows())):
            c_sq = F.dot(c, c)
            spread = max(F.upper(spread_terms[i][0] - 2 * F.dot(c, z) + c_sq), Fraction(0))
            hull = v_max + sqrt_up(F.upper(c_sq))
            move = softmax_move(F, deltas[i], v_max, spread)
            errs.append(ev + (hull if move is None else min(hull, z_rad[i] + move)))
        near = F._near_ball(C.data) if fine is not None else None
    if near is None:
        out = Rows(C, [up(e) for e in errs])
    else:
        parts, dist = near      # |c_ij - (p1 + p2)_ij| <= dist_ij: the row's l2 distance, <= sqrt(n) max_j dist_ij, joins its radius
        errs = [up(e + sqrt_up(len(row) * Fraction(max(row, default=0.0)) ** 2)) for e, row in zip(errs, dist.tolist())]
        out = Rows(IMat(B, None, C.shape, (parts, parts)), errs)
    return [take(B, out, range(h * m, (h + 1) * m)) for h in range(len(qs))]


def largest(xs: list) -> Fraction:
    """max(xs) for a nonempty list of rationals, each distinct object compared once (one radius shared by
    many rows: `uniform_radius`)."""
    return max({id(x): x for x in xs}.values())


def pattern(B: Backend, F: Backend, q: Rows, k: Rows, scores: IMat, div, visible: list):
    """(rows, deltas): one head's softmax pattern at F (rows of F's enclosures, zero past `visible`) from the
    point scores q^ k^T (`scores`) over div, and per row the bound delta_i of `head_output`'s docstring (every
    exact score of row i within delta_i of the point score used)."""
    div_lo, n = B.lower(div), k.centre.shape[0]
    q_norm = [sqrt_up(x) for x in row_sq_uppers(B, q.centre)[0]]
    k_max, ek = sqrt_up(row_sq_max(B, k.centre)), largest(k.eps)
    S, s_rad = F.centres(moved(F, scores).scale(1 / div))
    tops, zero = S.T.col_bounds()[1], F.num(0)      # each row's largest score (the shift's value is free)
    rows = [softmax(F, row[:m], t) + [zero] * (n - m) for row, m, t in zip(S.rows(), visible, tops)]
    deltas = [up((eq * k_max + (qn + eq) * ek) / div_lo + sr) for eq, qn, sr in zip(q.eps, q_norm, s_rad)]
    return rows, deltas


def pattern_times_values(F: Backend, P: IMat, V: IMat) -> IMat:
    """P V at F for the pattern P (F's balls) and values V: by the exact layer where V is a point of float64
    parts and P's balls lie within d of float64 parts (`exact_backend.near_times_parts`), else F's product."""
    near, parts = F._near_ball(P.data), exact_backend.multi_point(V)
    ends = exact_backend.near_times_parts(near, parts) if near is not None and parts is not None else None
    return IMat(F, None, (P.shape[0], V.shape[1]), ends) if ends is not None else P @ moved(F, V)


def moved(F: Backend, M: IMat) -> IMat:
    """The IMat M (of another backend) as one of backend F: its float64 ends, or its native entries (the
    same values; F's operations on them run at F's precision)."""
    return IMat(F, None, M.shape, M.ends) if M.ends is not None else IMat(F, M.data, M.shape)


def fine_heads(B: Backend):
    """The backend at twice B's precision that `head_output` runs softmax and P V on where the exact layer is
    on (its centres leave as float64 parts), else None (everything at B's precision)."""
    return make_backend(B.name, 2 * B.prec) if B.exact and B.prec <= EXACT_MAX_PREC else None


def softmax_move(B: Backend, delta: Fraction, v_max: Fraction, spread: Fraction):
    """min((e^(2 delta) - 1) v_max, delta e^delta sqrt(spread)) (head_output's ratio and mean-value bounds),
    or None above EXP_LIMIT (the hull bound is smaller there)."""
    if delta > EXP_LIMIT:
        return None
    e1 = B.upper(B.exp(B.num(delta)))
    return min((e1 * e1 - 1) * v_max, delta * e1 * sqrt_up(spread)) if delta else Fraction(0)


def heads_output(B: Backend, heads: list, W: IMat, norm: Fraction, head_norms: list, bias=None) -> Rows:
    """sum_h z_h @ W_h + b (the heads' outputs through the point matrices W_h stacked in W): the error of
    row i is <= min(||W||_2 sqrt(sum_h e_hi^2), sum_h ||W_h||_2 e_hi)."""
    errs = [min(norm * sqrt_up(sum(e * e for e in es)), sum(hn * e for hn, e in zip(head_norms, es)))
            for es in zip(*(h.eps for h in heads))]
    parts = [exact_backend.multi_point(h.centre) for h in heads]
    if all(p is not None and len(p) == len(parts[0]) for p in parts):   # float64 parts: side by side, exact
        side = tuple(np.hstack([p[i] for p in parts]) for i in range(len(parts[0])))
        Z = IMat(B, None, (len(errs), side[0].shape[1]), (side, side))
    else:
        per_head = [h.centre.rows() for h in heads]
        Z = B.matrix([sum((r[i] for r in per_head), []) for i in range(len(per_head[0]))])
    return recentre(B, with_bias(B, Z @ W, bias), errs)


def enclosures(B: Backend, X: Rows) -> list:
    """Per row, entrywise enclosures of the exact row: centre +- eps in every coordinate (|x_j - c_j| <=
    ||x - c||_2)."""
    return [[c + B.interval(-e, e) for c in row] for row, e in zip(X.centre.rows(), X.eps)]
