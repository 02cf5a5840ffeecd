"""Inline SVG plots for the audit report (no scripts, no external assets).

Floats appear here only to place bars on a page; every number printed beside a bar is the checker's
`show()` of the exact figure. Nothing here decides anything.
"""

import html
from fractions import Fraction

from tcert.checker.numbers import show

WIDTH, BAR, GAP, LABEL = 560, 16, 6, 230
MAX_BARS = 40


def bars(title: str, rows: list, colour: str = "#4a78b5", fmt=show) -> str:
    """A horizontal bar chart of (label, exact value) rows, each value printed by `fmt`; negative values grow
    left of the zero line."""
    rows = rows[:MAX_BARS]
    values = [float(v) for _, v in rows]
    lo, hi = min(0.0, *values), max(0.0, *values)
    span = (hi - lo) or 1.0
    plot = WIDTH - LABEL - 90
    zero = LABEL + plot * (0 - lo) / span
    height = 28 + len(rows) * (BAR + GAP)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
           f'aria-label="{html.escape(title)}"><text x="4" y="16" font-size="13" font-weight="bold">'
           f"{html.escape(title)}</text>"]
    for i, ((label, value), x) in enumerate(zip(rows, values)):
        y = 26 + i * (BAR + GAP)
        left, w = (zero, plot * x / span) if x >= 0 else (zero + plot * x / span, -plot * x / span)
        out.append(f'<text x="{LABEL - 6}" y="{y + 12}" font-size="11" text-anchor="end">'
                   f"{html.escape(str(label)[:40])}</text>"
                   f'<rect x="{left:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{BAR}" fill="{colour}"/>'
                   f'<text x="{max(left + w, zero) + 4:.1f}" y="{y + 12}" font-size="11">{html.escape(fmt(value))}</text>')
    out.append(f'<line x1="{zero:.1f}" y1="22" x2="{zero:.1f}" y2="{height}" stroke="#333"/></svg>')
    return "".join(out)


def figure_lookup(obligations: list, key: str):
    """The first figure `key` recorded by any obligation, or None."""
    for o in obligations:
        if key in o.figures:
            return o.figures[key]
    return None


def numeric(v) -> bool:
    return isinstance(v, (int, Fraction)) and not isinstance(v, bool)


def overwhelm_plots(obligations: list) -> list:
    """W against PTP/2 (the overwhelm condition W < PTP/2), and every per-head or per-competitor list figure."""
    out = []
    w, margin = figure_lookup(obligations, "evidence.deviation"), figure_lookup(obligations, "evidence.sample.margin")
    if numeric(w) and numeric(margin):
        half = Fraction(margin) / 2
        out.append(("overwhelm: the certified deviation W must stay below half the sample's certified margin",
                    bars("W vs PTP/2", [("W (certified deviation)", w), ("PTP/2 (half the sample margin)", half),
                                        ("PTP/2 - W (slack)", half - Fraction(w))])))
    for o in obligations:
        for key, value in o.figures.items():
            if isinstance(value, (list, tuple)) and 2 <= len(value) <= MAX_BARS and all(map(numeric, value)):
                out.append((f"{o.name}: {key}", bars(key, [(f"{i}", v) for i, v in enumerate(value)], "#6a8f3a")))
    return out


def accuracy_plot(cert, model, verdict: str) -> list:
    """Inputs covered by the certificate's cases per max token m, beside all inputs whose max is m."""
    from tcert.checker.kinds.accuracy.cases import case_inputs
    ev = cert.get("evidence", {}) if isinstance(cert, dict) else {}
    if model is None or ev.get("strategy") not in ("cubic", "subcubic") or not isinstance(ev.get("cases"), list):
        return []
    n, v = model.config.n_ctx, model.config.d_vocab
    covered = [0] * v
    try:
        for m, q, c, last in ev["cases"]:
            tokens = bin(int(last, 16)).count("1") if ev["strategy"] == "cubic" else int(last) + 1
            covered[m] += case_inputs(n, c, tokens if c else 1)
    except (TypeError, ValueError, IndexError):
        return []
    groups = max(1, v // 16)     # at most 16 bars: max tokens in groups
    rows = []
    for g in range(0, v, groups):
        hi = min(v, g + groups)
        total = (hi) ** n - g ** n
        rows.append((f"max token {g}..{hi - 1}" if groups > 1 else f"max token {g}",
                     Fraction(sum(covered[g:hi]), total)))
    state = "confirmed" if verdict == "VERIFIED" else "claimed, not confirmed"
    return [(f"accuracy: share of the inputs with each max token that the certificate's cases cover ({state})",
             bars("inputs covered / inputs, by max token", rows, "#b5764a"))]


def time_plot(obligations: list) -> list:
    """Seconds per obligation (the slowest ones when there are many)."""
    if len(obligations) < 2:
        return []
    rows = sorted(((o.name, Fraction(o.seconds)) for o in obligations), key=lambda r: -r[1])[:16]
    return [("seconds per obligation (the slowest, at most 16)", bars("seconds per obligation", rows, "#888", lambda s: f"{float(s):.3g} s"))]


def for_check(kind: str, obligations: list, cert, model, verdict: str) -> list:
    """(caption, svg) plots for one check."""
    out = []
    if kind == "overwhelm":
        out += overwhelm_plots(obligations)
    if kind == "accuracy":
        out += accuracy_plot(cert, model, verdict)
    return out + time_plot(obligations)
