"""`tcert overwhelm --free upto:N`: one certificate for every free length 0..N (Definition 1.1).

Length 0 is a prediction claim on prefix + [query]; each length L >= 1 is generated exactly as an
`any:L` certificate (any method) and its evidence is stored as `evidence.lengths[L]`. A certificate is
written only when every length is Overwhelmed with the same predicted token k.
"""

from checker.errors import BadInput

from . import certio
from .prediction import prediction_claim


def parse_upto(spec: str) -> int:
    """N from "upto:N" (N >= 0), or BadInput."""
    try:
        n = int(spec[len("upto:"):])
    except ValueError:
        raise BadInput(f"--free {spec!r}: expected upto:N") from None
    if n < 0:
        raise BadInput("--free upto:N needs N >= 0")
    return n


def generate_upto(model, prefix, query, n, method="lp", value_bound="auto", hints="auto"):
    """Returns (cert or None, report). report["lengths"][L] is the per-length report (L >= 1) and
    report["failing"] lists the lengths that are not Overwhelmed (or predict a different token)."""
    from .overwhelm import generate
    from .overwhelm_tight import generate_tight
    c = model.config
    if len(prefix) + n + 1 > c.n_ctx:
        raise BadInput(f"need n_fix + N + 1 <= n_ctx = {c.n_ctx}")
    if any(not 0 <= t < c.d_vocab for t in list(prefix) + [query]):
        raise BadInput(f"token ids must lie in [0, {c.d_vocab})")
    sample, p = prediction_claim(model, list(prefix) + [query])
    k = p["predicted"]
    failing = [] if sample is not None else [0]
    evidences, reports = [sample], [{"verdict": "Overwhelmed" if sample else "Inconclusive", "predicted": k}]
    for L in range(1, n + 1):
        if method == "tight":
            cert, rep = generate_tight(model, prefix, query, ("any", L, None))
        else:
            cert, rep = generate(model, prefix, query, ("any", L, None), method, value_bound, hints)
        reports.append(rep)
        if cert is None or cert["claim"]["predicted"] != k:
            failing.append(L)
        else:
            evidences.append(cert["evidence"])
    report = {"verdict": "Overwhelmed" if not failing else "Inconclusive", "predicted": k, "failing": failing,
              "lengths": reports, "n_fix": len(prefix), "upto": n, "method": method}
    if failing:
        return None, report
    claim = {"prefix": list(prefix), "query": query, "predicted": k, "free": {"kind": "upto", "length": n}}
    info = {"verdict": "Overwhelmed", "lengths": n + 1}
    return certio.envelope("overwhelm", model, claim, {"lengths": evidences}, info), report


def format_report(r) -> str:
    """One line per length."""
    lines = [f"{r['verdict']}: every free length 0..{r['upto']} (n_fix {r['n_fix']}, method {r['method']}); "
             f"predicted token {r['predicted']}"]
    for L, rep in enumerate(r["lengths"]):
        lines.append(f"  length {L}: {rep['verdict']}, predicts {rep['predicted']}")
    if r["failing"]:
        lines.append("  failing lengths: " + ", ".join(str(L) for L in r["failing"]))
    return "\n".join(lines)
