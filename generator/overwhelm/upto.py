"""`tcert overwhelm --free upto:N`: one certificate for every free length 0..N (Definition 1.1).

Length 0 is a prediction claim on prefix + [query]; each length L >= 1 gets the evidence of an `any:L`
certificate (any method), stored as `evidence.lengths[L]`. A certificate is written only when every
length is Overwhelmed with the same predicted token k. For methods naive/lp the length-independent work
is done once (`Shared`, mirroring the checker's `tcert.checker.kinds.overwhelm.upto.UptoTables`); method
tight runs per length.
"""

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.forward import Weights
from tcert.checker.interval import make_backend
from tcert.checker.kinds.overwhelm.tables import table_fits
from tcert.checker.kinds.overwhelm.upto import UptoTables

from tcert.generator import certificate
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tables import FloatModel, float_fixed
from tcert.generator.overwhelm.tight import generate_tight
from tcert.generator.prediction import prediction_claim


class Shared:
    """The work every free length 1..N shares, done once: the float score table of the allowed tokens
    (the whole vocabulary) for offsets 1..N (length L uses the last L columns: free column c has offset
    L - c) and their value vectors before centring; and, only when a length needs tight hints, the
    checker's UptoTables for both backends, so hints are written against the enclosures it computes."""

    def __init__(self, model, prefix, query, n: int, mode: str):
        self.model, self.prefix, self.query, self.n, self.mode, self.rig = model, list(prefix), query, n, mode, None
        fm = self.fm = FloatModel(model)
        H = model.config.n_heads
        Xa = fm.ln(list(range(model.config.d_vocab)))
        q = float_fixed(fm, prefix, query, n)[0]
        qrot = fm.rotate(q, [n - i for i in range(n)]) / fm.div                  # (N, H, dh): offsets N..1
        wcols = np.einsum("hde,che->hdc", fm.WK, qrot)
        consts = np.einsum("he,che->hc", fm.bK, qrot)
        self.S = np.stack([Xa @ wcols[h] for h in range(H)]) + consts[:, None, :]    # (H, vocab, N)
        self.V = np.stack([Xa @ fm.WV[h] for h in range(H)])                          # (H, vocab, d_head)

    def float_tables(self, L: int) -> dict:
        """tcert.generator.overwhelm.tables.float_tables for free length L, from the shared tables."""
        _, lq, alpha_fix, u = float_fixed(self.fm, self.prefix, self.query, L)
        return dict(lq=lq, alpha_fix=alpha_fix, u=u, values=self.V - u[:, None, :], S=self.S[:, :, self.n - L:])

    def rigorous(self, L: int) -> list:
        """[(B, W, heads of length L)] for both backends (built on first use)."""
        if self.rig is None:
            self.rig = []
            allowed = list(range(self.model.config.d_vocab))
            for name in ("mpmath", "flint"):
                B = make_backend(name)
                W = Weights(B, self.model)
                self.rig.append((B, W, UptoTables(B, self.model, self.prefix, self.query, self.n, self.mode,
                                                  allowed, W)))
        return [(B, W, t.heads(L)) for B, W, t in self.rig]


def parse_upto(spec: str) -> int:
    """N from "upto:N" (N >= 0), or BadInput."""
    try:
        n = int(spec[len("upto:"):])
    except ValueError:
        raise BadInput(f"--free {spec!r}: expected upto:N") from None
    if n < 0:
        raise BadInput("--free upto:N needs N >= 0")
    return n


def generate_upto(model, prefix, query, n, method="lp", value_bound="auto", hints="auto", force=False):
    """Returns (cert or None, report). report["lengths"][L] is the per-length report (L >= 1) and
    report["failing"] lists the lengths that are not Overwhelmed (or predict a different token).
    force=True (benchmarks) writes the certificate even so, with every length's forced evidence, unless a
    length predicts another token (its evidence would prove nothing about k: no certificate)."""
    c = model.config
    if len(prefix) + n + 1 > c.n_ctx:
        raise BadInput(f"need n_fix + N + 1 <= n_ctx = {c.n_ctx}")
    if any(not 0 <= t < c.d_vocab for t in list(prefix) + [query]):
        raise BadInput(f"token ids must lie in [0, {c.d_vocab})")
    sample, p = prediction_claim(model, list(prefix) + [query])
    k = p["predicted"]
    failing = [] if sample is not None else [0]
    evidences, reports = [sample], [{"verdict": "Overwhelmed" if sample else "Inconclusive", "predicted": k}]
    if method != "tight" and value_bound == "auto":   # the whole vocabulary is allowed at every length
        value_bound = "table" if table_fits(c, c.d_vocab) else "norm"
    shared = Shared(model, prefix, query, n, value_bound) if method != "tight" and n >= 1 else None
    for L in range(1, n + 1):
        if method == "tight":
            cert, rep = generate_tight(model, prefix, query, ("any", L, None), force=force)
        else:
            cert, rep = generate(model, prefix, query, ("any", L, None), method, value_bound, hints, force, shared)
        reports.append(rep)
        if cert is None or cert["claim"]["predicted"] != k or rep["verdict"] != "Overwhelmed":
            failing.append(L)
        if cert is not None and cert["claim"]["predicted"] == k:   # never another token's evidence, even forced
            evidences.append(cert["evidence"])
    report = {"verdict": "Overwhelmed" if not failing else "Inconclusive", "predicted": k, "failing": failing,
              "lengths": reports, "n_fix": len(prefix), "upto": n, "method": method}
    if failing and not (force and sample is not None and len(evidences) == n + 1):
        return None, report
    claim = {"prefix": list(prefix), "query": query, "predicted": k, "free": {"kind": "upto", "length": n}}
    info = {"verdict": report["verdict"], "lengths": n + 1}
    return certificate.envelope("overwhelm", model, claim, {"lengths": evidences}, info), report


def format_report(r) -> str:
    """One line per length."""
    lines = [f"{r['verdict']}: every free length 0..{r['upto']} (n_fix {r['n_fix']}, method {r['method']}); "
             f"predicted token {r['predicted']}"]
    for L, rep in enumerate(r["lengths"]):
        lines.append(f"  length {L}: {rep['verdict']}, predicts {rep['predicted']}")
    if r["failing"]:
        lines.append("  failing lengths: " + ", ".join(str(L) for L in r["failing"]))
    return "\n".join(lines)
