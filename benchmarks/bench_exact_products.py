"""Benchmark: exact products (`tcert.checker.exact_products`) against float64 numpy and Arb (a script
that prints figures, not a test). Ratios are same-run and interleaved: each figure is timed in
alternation with that shape's float64 product (--repeat rounds of reference, candidate), and the ratio
is the candidate's best over the reference's best in those rounds, so load drift on a shared machine
moves both.

Paper-scale shapes (random float32 weights, N(0, 0.02); left operands N(0, 0.5) as float32):
  unembed  64 x 512 @ 512 x 30522   (a block of residual rows times W_U)
  mlp      1536 x 512 @ 512 x 2048  (a 1,536-token sample times W_in)
For each: float64 numpy product; the exact point product (float32 left operand, all digit pairs);
the interval x point product (left operand an interval: `narrow` = +-2^-60 relative, as an Arb ball
at 64 bits; `chained` = +-2^-40 relative, as after earlier rounded steps) with the digit pairs
s + t < keep multiplied exactly, keep 2 and 3, each with the float64 exit (`float_bounds`); the
result's way into Arb (from float64 bounds, or rounded to 62 bits by `round_out`, then
`to_arb_mat`); python-flint's arb_mat product of the same floats at 64 bits; the one-time cost of
cutting the weight matrix; and the median relative width of each enclosure. The interval x point
product by a grid and envelopes, `round_out` and the Rounded way into Arb are no longer on a verdict
path (the checker multiplies an interval's ends as point matrices, `exact_backend`); they live in
`tcert.testing.exact_reference` and are measured here as before.
Then: building one 512 x 30522 Arb matrix from stored floats the current way (nested tolist, one
arb per entry) against a flat list, and against not building it (cutting it for the layer instead).

    python benchmarks/bench_exact_products.py [--repeat N] [--skip-arb]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flint  # noqa: E402

from tcert.checker import exact_products as ep  # noqa: E402
from tcert.checker import exact_rounding as er  # noqa: E402
from tcert.testing import exact_reference as xr  # noqa: E402

SHAPES = {"unembed": (64, 512, 30522), "mlp": (1536, 512, 2048)}


def against(fn, ref, repeat):
    """(seconds, ratio, result): fn's best time, and its ratio to ref's best, over `repeat`
    alternating rounds of ref then fn."""
    t_ref = t_fn = None
    for _ in range(repeat):
        start = time.perf_counter()
        ref()
        mid = time.perf_counter()
        result = fn()
        end = time.perf_counter()
        t_ref = mid - start if t_ref is None else min(t_ref, mid - start)
        t_fn = end - mid if t_fn is None else min(t_fn, end - mid)
    return t_fn, t_fn / t_ref, result


def best(fn, repeat):
    """(seconds, result): the best of `repeat` wall-clock runs."""
    out, result = None, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        took = time.perf_counter() - start
        out = took if out is None else min(out, took)
    return out, result


def width(lo, hi, exact):
    """Median of (hi - lo) / |exact| over entries with exact != 0."""
    keep = exact != 0
    return float(np.median((hi - lo)[keep] / np.abs(exact[keep])))


def bench_shape(name, shape, repeat, skip_arb):
    m, k, n = shape
    rng = np.random.default_rng(1)
    a32 = (rng.standard_normal((m, k)) * 0.5).astype(np.float32)
    w32 = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    a, w = ep.exact_matrix(a32), ep.exact_matrix(w32)
    ref = lambda: a @ w  # noqa: E731
    t_f64, exact = best(ref, max(repeat, 5))
    bits = ep.bits_for(k)
    t_cut, _, wcut = against(lambda: ep.cut_cols(w, bits), ref, 1)
    t_upper, _, _ = against(lambda: xr.abs_upper(wcut), ref, 1)
    rows = [("float64 numpy product", t_f64, 1.0, None)]
    t, q, c = against(lambda: ep.point_product(ep.cut_rows(a, bits), wcut), ref, repeat)
    rows.append(("exact point product (all digit pairs)", t, q, None))
    t, q, (lo, hi) = against(lambda: er.float_bounds(ep.point_product(ep.cut_rows(a, bits), wcut)), ref, repeat)
    rows.append(("  + float64 exit (float_bounds)", t, q, width(lo, hi, exact)))
    for label, rel in (("narrow", 2.0 ** -60), ("chained", 2.0 ** -40)):
        x = xr.Interval(a - np.abs(a) * rel, a + np.abs(a) * rel)
        for keep in (2, 3):
            t, q, (lo, hi) = against(lambda: er.float_bounds(xr.interval_product(x, wcut, keep)), ref, repeat)
            rows.append((f"interval x point, {label}, keep {keep}, + float64 exit", t, q, width(lo, hi, exact)))
    x = xr.Interval(a - np.abs(a) * 2.0 ** -60, a + np.abs(a) * 2.0 ** -60)
    r = xr.interval_product(x, wcut)
    flint.ctx.prec = 64
    t, q, _ = against(lambda: er.to_arb_mat(er.float_bounds(r)), ref, 1)
    rows.append(("interval result into Arb: float_bounds + to_arb_mat", t, q, None))
    t, q, _ = against(lambda: xr.to_arb_mat(xr.round_out(r, 62)), ref, 1)
    rows.append(("interval result into Arb: round_out(62) + to_arb_mat", t, q, None))
    if not skip_arb:
        t, q, warb = against(lambda: current_arb(w), ref, 1)
        rows.append(("Arb: build W the current way (one arb per entry)", t, q, None))
        aarb = current_arb(a)
        t, q, prod = against(lambda: aarb * warb, ref, 1)
        rows.append(("Arb: arb_mat product at 64 bits (point x point)", t, q, arb_width(prod, exact)))
    print(f"\n{name}: {m} x {k} @ {k} x {n}, digits of {bits} bits, W cut into {len(wcut.digits)} digits "
          f"(lines per digit {[len(i) for i in wcut.index]})")
    print(f"  one-time: cut W {t_cut:.3f} s ({t_cut / t_f64:.1f}x), |W| upper digit {t_upper:.3f} s "
          f"({t_upper / t_f64:.1f}x)")
    for label, t, q, wid in rows:
        extra = "" if wid is None else f"   median rel. width {wid:.2e}"
        print(f"  {label:58s} {t:8.3f} s  {q:6.2f}x{extra}")


def arb_width(prod, exact, samples=300):
    """Median relative width 2 rad / |exact| of an Arb result, on a sample of entries."""
    rng = np.random.default_rng(0)
    out = []
    for i, j in zip(rng.integers(0, exact.shape[0], samples), rng.integers(0, exact.shape[1], samples)):
        if exact[i, j]:
            out.append(2 * float(prod[int(i), int(j)].rad()) / abs(exact[i, j]))
    return float(np.median(out))


def current_arb(x):
    """The interval layer's way today: nested tolist, flattened, one arb per entry."""
    rows = x.astype(np.float64).tolist()
    return flint.arb_mat(x.shape[0], x.shape[1], [v for row in rows for v in row])


def bench_build(repeat):
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((512, 30522)) * 0.02).astype(np.float32)
    flint.ctx.prec = 64
    t_cur, _ = best(lambda: current_arb(w), 1)
    t_flat, _ = best(lambda: flint.arb_mat(512, 30522, w.astype(np.float64).ravel().tolist()), 1)
    t_cut, _ = best(lambda: ep.cut_cols(ep.exact_matrix(w), ep.bits_for(512)), 1)
    print("\nbuild one 512 x 30522 matrix from stored float32 weights:")
    print(f"  Arb, the current way (nested tolist, flatten, one arb per entry)  {t_cur:7.3f} s  1.00x")
    print(f"  Arb, a flat list (python-flint still makes one arb per entry)     {t_flat:7.3f} s  {t_flat / t_cur:.2f}x")
    print(f"  the exact layer: cut into digits, no Arb matrix at all             {t_cut:7.3f} s  {t_cut / t_cur:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-arb", action="store_true", help="skip the (slow) Arb products")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; numpy {np.__version__}, "
          f"python-flint {flint.__version__}")
    for name, shape in SHAPES.items():
        bench_shape(name, shape, args.repeat, args.skip_arb)
    bench_build(args.repeat)


if __name__ == "__main__":
    main()
