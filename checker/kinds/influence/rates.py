"""The claimed rate r(n) and the position weights rho_k(m) the induction carries (docs/influence.md,
steps 6 and 7): rho_k(m) = 1/n for bidirectional attention (and after one block), H_m^(k-1)/m for
causal attention after k >= 2 blocks."""

from fractions import Fraction

RATES = ("inverse", "harmonic")


EXACT_HARMONIC = 4096   # H_n exactly up to here; beyond, its exact denominator lcm(1..n) has ~1.44 n bits
HARMONIC_BITS = 128


def harmonic(n: int) -> Fraction:
    """H_n = 1 + 1/2 + ... + 1/n exactly for n <= EXACT_HARMONIC; beyond, an upper bound that exceeds it by
    less than n 2^-HARMONIC_BITS (each 1/k rounded up to a multiple of 2^-HARMONIC_BITS)."""
    if n <= EXACT_HARMONIC:
        return sum((Fraction(1, k) for k in range(1, n + 1)), Fraction(0))
    one = 1 << HARMONIC_BITS
    return Fraction(sum(-(-one // k) for k in range(1, n + 1)), one)


def rate(name: str, n: int, n_layers: int) -> Fraction:
    """r(n) of the claimed rate, or an upper bound of it (the corollary only needs one): 1/n ("inverse") or
    H_n^(n_layers-1)/n ("harmonic")."""
    return Fraction(1, n) if name == "inverse" else harmonic(n) ** (n_layers - 1) / n


def rate_text(name: str, n_layers: int) -> str:
    """r(n) as the summary line writes it."""
    return "1/n" if name == "inverse" else f"H_n^{n_layers - 1}/n"


def cap_factor(B, n_max: int, k: int, causal: bool) -> Fraction:
    """An upper bound of max_{m <= n_max} 1/rho_k(m): n_max when rho_k(m) = 1/n (bidirectional) or k = 1;
    max_m m / H_m^(k-1) when rho_k(m) = H_m^(k-1)/m (causal, after k >= 2 blocks)."""
    if not causal or k == 1:
        return Fraction(n_max)
    best, h_m = Fraction(0), B.num(0)
    for m in range(1, n_max + 1):
        h_m = h_m + B.num(1) / m
        best = max(best, B.upper(B.exp(B.log(B.num(m)) - (k - 1) * B.log(h_m))))
    return best


def row_cap(B, n_max: int, width: Fraction, layer: int, causal: bool) -> Fraction:
    """kappa_row >= max over rows m <= n_max of (m keys) * (the changed key's weight cap) / (m rho(m)): in a
    row of M keys whose scores spread by <= width, every weight is <= 1/(1 + (M-1) e^(-width)). Bidirectional
    rows have n keys and rho = 1/n; causal row m has m keys and rho_(layer+1)(m) = H_m^layer / m, so
    kappa_row = max_m m / ((1 + (m-1) e^(-width)) H_m^layer) (m / (1 + (m-1) e^(-width)) grows with m)."""
    decay = B.exp(B.num(-width))
    if not causal or layer == 0:
        return B.upper(n_max / (1 + (n_max - 1) * decay))
    best, h_m = Fraction(0), B.num(0)
    for m in range(1, n_max + 1):
        h_m = h_m + B.num(1) / m
        best = max(best, B.upper(m / ((1 + (m - 1) * decay) * h_m ** layer)))
    return best


def rest_cap(B, n_max: int, width: Fraction) -> Fraction:
    """kappa >= m * (the weight cap of an unchanged key among the other m - 1 keys of causal row m), for every
    2 <= m <= n_max: m / (1 + (m-2) e^(-width)); its derivative in m has the sign of 1 - 2 e^(-width), so the
    maximum is at m = 2 (value 2) or at m = n_max (a row without the changed key is capped lower)."""
    return max(Fraction(2), B.upper(n_max / (1 + (n_max - 2) * B.exp(B.num(-width)))))
