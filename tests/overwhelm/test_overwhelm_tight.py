"""Overwhelm method "tight" (checker/kinds/overwhelm/tight.py): soundness against an exhaustive 110-bit oracle,
never weaker than naive/lp, Dinkelbach lambdas equal the brute-force per-head maxima, mutations, CLI."""

import copy
import itertools
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings

from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_number
from tcert.generator.certificate import format_number
from tcert.checker.interval import make_backend
from tcert.checker.kinds.overwhelm import check
from tcert.checker.obligations import Obligations
from tcert.testing import example_scale
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tables import FloatModel, float_tables
from tcert.generator.overwhelm.tight import generate_tight
from tcert.testing.overwhelm import exhaustive_confirms, model_of, tiny_neox1l, verdict
from tcert.testing.overwhelm import tight_scenarios as scenarios

BACKENDS = ("flint", "mpmath")


def test_tight_sound_and_never_weaker_than_naive_lp():
    """Every VERIFIED tight certificate holds on all of T (110-bit oracle); both backends agree; whenever
    naive/lp certify, tight certifies too."""
    stats = Counter()

    @settings(max_examples=example_scale(150), deadline=None)
    @given(scenarios())
    def prop(s):
        tensors, cfg = tiny_neox1l(**s["model_args"])
        model = model_of(tensors, cfg)
        spec = (s["kind"], s["n_free"], s["multiset"])
        stats["examples"] += 1
        cert, rep = generate_tight(model, s["prefix"], s["query"], spec, relax=s["relax"], exact_all=s["exact_all"])
        tight_ok = False
        if cert is not None:
            verdicts = {b: verdict(model, cert, b) for b in BACKENDS}   # (rejection digits may differ)
            assert (verdicts["flint"] == "VERIFIED") == (verdicts["mpmath"] == "VERIFIED"), verdicts
            tight_ok = verdicts["flint"] == "VERIFIED"
            if tight_ok:
                stats["verified"] += 1
                stats[f"verified {s['kind']}"] += 1
                stats["verified with exact competitors"] += rep["exact_competitors"] > 0
                stats["verified with assignment duals"] += any("duals" in e for e in cert["evidence"]["exact"])
                ok, gap = exhaustive_confirms(model, s["prefix"], s["query"], s["kind"], s["n_free"],
                                              s["multiset"], cert["claim"]["predicted"])
                assert ok, f"VERIFIED tight certificate contradicted exhaustively (gap {gap}): {cert['claim']}"
        paper, prep = generate(model, s["prefix"], s["query"], spec, s["paper"], "table", "tight")
        if prep["margin"] == prep["margin"]:
            # naive and lp imply logit_j - logit_k <= 2 W - PTP for every j (W their deviation bound);
            # tight's bound is never larger
            implied = 2 * prep["deviation"] - prep["margin"]
            assert rep["worst_bound"] <= implied + 1e-6 * (1 + abs(implied)), (s["paper"], rep, implied)
            stats[f"numeric comparisons with {s['paper']}"] += 1
        if paper is not None and verdict(model, paper, "flint") == "VERIFIED":
            stats["paper verified"] += 1
            assert tight_ok, f"{paper['evidence']['method']} certifies but tight does not: {s}"
            assert cert["claim"]["predicted"] == paper["claim"]["predicted"]

    prop()
    print("overwhelm tight soundness:", dict(stats))
    assert stats["verified"] >= 0.2 * stats["examples"], dict(stats)
    assert stats["verified any"] > 0 and stats["verified perm"] > 0, dict(stats)
    assert stats["verified with exact competitors"] > 0 and stats["paper verified"] > 0, dict(stats)
    assert stats["verified with assignment duals"] > 0 and stats["numeric comparisons with naive"] > 0, dict(stats)
    assert stats["numeric comparisons with lp"] > 0, dict(stats)
    assert stats["verified"] > stats["paper verified"], dict(stats)


CASES = {"perm": (2, 8, ("perm", 3, [0, 3, 4])), "any": (2, 8, ("any", 2, None)),
         "perm5": (16, 12, ("perm", 3, [0, 3, 4]))}


@pytest.fixture(scope="module")
def certs():
    """Tight certificates that need the exact bound (naive/lp are Inconclusive on all of them)."""
    out = {}
    for name, (seed, n_fix, spec) in CASES.items():
        m = model_of(*tiny_neox1l(seed, qk_scale=0.5))
        cert, rep = generate_tight(m, [1] * n_fix, 2, spec)
        assert cert is not None and rep["exact_competitors"] > 0, rep
        for method in ("naive", "lp"):
            assert generate(m, [1] * n_fix, 2, spec, method, "table", "tight")[0] is None
        out[name] = (m, [1] * n_fix, spec, cert)
    assert any("duals" in e for e in out["perm5"][3]["evidence"]["exact"])   # the assignment path is exercised
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_cases_verify_and_hold(name, certs):
    m, prefix, spec, cert = certs[name]
    for b in BACKENDS:
        ob = Obligations()
        check(m, cert["claim"], cert["evidence"], make_backend(b), ob)
        assert "competitors needed the exact per-head bound" in ob.summary
    ok, _ = exhaustive_confirms(m, prefix, 2, spec[0], spec[1], spec[2], cert["claim"]["predicted"])
    assert ok


@pytest.mark.parametrize("name", sorted(CASES))
def test_lambdas_are_the_exact_per_head_maxima(name, certs):
    """Each lambda is the brute-force max of the head's ratio (over T with duals, over the relaxation
    allowed^n_free without), up to the hint slack."""
    m, prefix, (kind, n_free, multiset), cert = certs[name]
    c, k = m.config, cert["claim"]["predicted"]
    allowed = list(range(c.d_vocab)) if multiset is None else sorted(set(multiset))
    fm = FloatModel(m)
    T = float_tables(fm, prefix, 2, allowed, n_free)
    relaxed = list(itertools.product(range(len(allowed)), repeat=n_free))
    perms = relaxed if multiset is None else list(set(itertools.permutations([allowed.index(t) for t in multiset])))
    for e in cert["evidence"]["exact"]:
        j = e["competitor"]
        strings = perms if "duals" in e else relaxed   # no duals: the separable (relaxed) maximum
        for h in range(c.n_heads):
            b = np.exp(T["S"][h] - T["lq"][h])
            cj = T["values"][h] @ fm.WO[h] @ (fm.WU[:, j] - fm.WU[:, k])
            best = max(sum(b[t, i] * cj[t] for i, t in enumerate(s)) / (T["alpha_fix"][h] + sum(b[t, i] for i, t in enumerate(s)))
                       for s in strings)
            lam = float(parse_number(e["lambdas"][h], "lambda"))
            assert best - 1e-9 <= lam <= best + 1e-5 * (1 + abs(best)), (j, h, lam, best)


def lowered(x: str, rel=2.0 ** -16) -> str:
    """The number x lowered by rel * (1 + |x|)."""
    q = parse_number(x, "x")
    return format_number(q - Fraction(rel) * (1 + abs(q)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_mutations_rejected(backend, name, certs):
    m, _, spec, cert = certs[name]
    ev = cert["evidence"]
    for n, e in enumerate(ev["exact"]):
        for h in range(m.config.n_heads):
            bad = copy.deepcopy(cert)
            bad["evidence"]["exact"][n]["lambdas"][h] = lowered(e["lambdas"][h], 2.0 ** -10)
            assert verdict(m, bad, backend).startswith(
                f"REJECTED: overwhelm tight: Dinkelbach inequalities: head {h}, competitor {e['competitor']}: "), (n, h)
            if "duals" in e:
                for vec, i in (("u", 0), ("v", spec[1] - 1)):
                    bad = copy.deepcopy(cert)
                    d = bad["evidence"]["exact"][n]["duals"][h][vec]
                    d[i] = lowered(d[i], 2.0 ** -10)
                    assert "dual feasibility" in verdict(m, bad, backend), (n, h, vec)
    bad = copy.deepcopy(cert)    # drop a competitor that needs the exact bound
    bad["evidence"]["exact"] = ev["exact"][1:]
    assert "cheap bound" in verdict(m, bad, backend)
    bad = copy.deepcopy(cert)    # claim another token
    bad["claim"]["predicted"] = ev["exact"][0]["competitor"]
    assert verdict(m, bad, backend).startswith("REJECTED")


def test_malformed_evidence(certs):
    m, _, _, cert = certs["perm5"]
    for edit in (lambda ev: ev["exact"][0]["duals"].pop(), lambda ev: ev["exact"][0]["lambdas"].pop(),
                 lambda ev: ev["exact"][0]["duals"][0]["u"].pop(),
                 lambda ev: ev["exact"].append(copy.deepcopy(ev["exact"][0])), lambda ev: ev.update(extra=1)):
        bad = copy.deepcopy(cert)
        edit(bad["evidence"])
        with pytest.raises(BadInput):
            check(m, bad["claim"], bad["evidence"], make_backend("flint"), Obligations())


def test_cli_tight_on_shipped_model(tmp_path, capsys):
    """`tcert overwhelm --method tight` on the shipped tiny model writes a certificate tcert-check verifies
    with both backends (the shipped example needs the LP; tight certifies it too)."""
    import json

    from tcert.checker.verify import verify
    from tcert.testing import CERTIFICATES
    from tcert.generator.cli import main as tcert
    ship = CERTIFICATES / "overwhelm"
    claim = json.loads((ship / "perm_lp.json").read_text())["claim"]
    out = tmp_path / "t.json"
    code = tcert(["overwhelm", "--model", str(ship / "neox1l_tiny.safetensors"),
                  "--prefix-ids", ",".join(map(str, claim["prefix"])), "--query-id", str(claim["query"]),
                  "--free", "perm:" + ",".join(map(str, claim["free"]["tokens"])), "--method", "tight",
                  "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)["figures"]
    assert code == 0 and report["verdict"] == "Overwhelmed" and report["predicted"] == claim["predicted"]
    for b in BACKENDS:
        ob = verify(str(out), str(ship / "neox1l_tiny.safetensors"), b)
        cert = ob.certificate
        assert cert["evidence"]["method"] == "tight" and "tight" in ob.summary
