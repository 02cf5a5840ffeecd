"""Overwhelm `free: upto:N` (every free length 0..N in one certificate): exhaustive-oracle soundness on tiny
models, per-length mutations and removals, claim/evidence length mismatch, both backends, CLI; the tables
shared across lengths (tcert.checker.kinds.overwhelm.upto.UptoTables) against the per-length `head_tables`
and verdicts."""

import copy
import json
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.verify import verify
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import make_backend
from tcert.checker.forward import Weights
from tcert.checker.kinds.overwhelm import check, check_fixed_length
from tcert.checker.kinds.overwhelm.naive_lp import deviation_bound, naive_free_mass
from tcert.checker.kinds.overwhelm.tables import beta_bounds, head_tables
from tcert.checker.kinds.overwhelm.upto import UptoTables
from tcert.checker.obligations import Obligations
from tcert.generator.cli import main as tcert
from tcert.generator.model.files import save_model
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tables import FloatModel, float_tables
from tcert.generator.overwhelm.upto import Shared, generate_upto
from tcert.testing.overwhelm import exhaustive_confirms, model_of, tiny_neox1l

BACKENDS = ("flint", "mpmath")
N = 3
CASES = [(14, 30, "naive"), (57, 30, "naive"), (14, 20, "tight"), (0, 20, "tight")]


def run_check(model, cert, backend="flint"):
    """The kind's check on an in-memory certificate; returns the Obligations."""
    ob = Obligations()
    check(model, cert["claim"], cert["evidence"], make_backend(backend), ob)
    return ob


def outcome(model, cert, backend):
    """'VERIFIED', 'REJECTED' or 'BADINPUT' for an in-memory certificate."""
    try:
        run_check(model, cert, backend)
        return "VERIFIED"
    except Rejected:
        return "REJECTED"
    except BadInput:
        return "BADINPUT"


@pytest.fixture(scope="module")
def certs():
    """Generated upto:N certificates on tiny models (naive and tight evidence)."""
    out = []
    for seed, n_fix, method in CASES:
        m = model_of(*tiny_neox1l(seed, qk_scale=0.5))
        cert, rep = generate_upto(m, [1] * n_fix, 2, N, method, "auto", "tight")
        assert cert is not None, (seed, n_fix, method, rep["failing"])
        assert cert["claim"]["free"] == {"kind": "upto", "length": N}
        assert len(cert["evidence"]["lengths"]) == N + 1
        out.append((m, cert))
    return out


def test_verified_upto_is_true_for_every_length(certs):
    """Each VERIFIED certificate (both backends) holds for all strings of every length 0..N (110-bit oracle)."""
    for m, cert in certs:
        for backend in BACKENDS:
            ob = run_check(m, cert, backend)
            assert f"every string of length 0..{N}" in ob.summary
        c = cert["claim"]
        for L in range(N + 1):
            ok, gap = exhaustive_confirms(m, c["prefix"], c["query"], "any", L, None, c["predicted"])
            assert ok and gap > 0, (L, gap)


def mutations(cert):
    """(name, mutated certificate) pairs that must not verify."""
    out = []
    ev = cert["evidence"]["lengths"]
    for L in range(N + 1):
        e = copy.deepcopy(cert)
        del e["evidence"]["lengths"][L]                    # one length's evidence removed
        out.append((f"remove {L}", e))
        if L == 0 or ev[L]["method"] == "naive":   # (tight evidence names no length: it may truly hold for two)
            e = copy.deepcopy(cert)
            e["evidence"]["lengths"][L] = copy.deepcopy(ev[(L % N) + 1 if L else 1])   # another length's evidence
            out.append((f"swap {L}", e))
        e = copy.deepcopy(cert)
        x = e["evidence"]["lengths"][L]
        if L == 0:
            x["margin"] = "1000"                          # overclaimed margin at length 0
        elif x["method"] == "tight":
            x["method"] = "naive"                         # evidence no longer matches its method
        else:
            x["deviation"] = "0"                          # deviation below the certified bound
        out.append((f"mutate {L}", e))
        if L >= 1 and ev[L]["method"] == "tight" and ev[L].get("exact"):
            e = copy.deepcopy(cert)
            e["evidence"]["lengths"][L]["exact"][0]["lambdas"] = ["-1000"] * len(ev[L]["exact"][0]["lambdas"])
            out.append((f"lambdas {L}", e))
    e = copy.deepcopy(cert)
    e["claim"]["predicted"] = (cert["claim"]["predicted"] + 1) % 6
    out.append(("other token", e))
    e = copy.deepcopy(cert)
    e["claim"]["prefix"] = e["claim"]["prefix"][1:]
    out.append(("shorter prefix", e))
    return out


def test_mutated_or_missing_length_is_not_verified(certs):
    """Every mutation is REJECTED or BadInput, with the same outcome on both backends."""
    for m, cert in certs:
        for name, e in mutations(cert):
            got = {b: outcome(m, e, b) for b in BACKENDS}
            assert got["flint"] == got["mpmath"] != "VERIFIED", (name, got)


def test_one_inconclusive_length_rejects_the_whole_certificate(certs):
    """Length 2's evidence replaced by a forced (Inconclusive) naive any:2 evidence: REJECTED at length 2."""
    m, cert = certs[3]
    c = cert["claim"]
    forced, rep = generate(m, c["prefix"], c["query"], ("any", 2, None), "naive", "auto", "tight", force=True)
    assert rep["verdict"] == "Inconclusive" and forced["claim"]["predicted"] == c["predicted"]
    e = copy.deepcopy(cert)
    e["evidence"]["lengths"][2] = forced["evidence"]
    for b in BACKENDS:
        with pytest.raises(Rejected) as err:
            run_check(m, e, b)
        assert err.value.obligation.startswith("overwhelm upto: length 2, naive: ")


def test_claiming_more_lengths_than_evidence_is_rejected(certs):
    """Claiming N+1 with evidence for 0..N is refused; padding with the length-N evidence is REJECTED."""
    m, cert = certs[0]
    e = copy.deepcopy(cert)
    e["claim"]["free"]["length"] = N + 1
    with pytest.raises(BadInput):
        run_check(m, e)
    e["evidence"]["lengths"].append(copy.deepcopy(cert["evidence"]["lengths"][N]))
    for b in BACKENDS:
        assert outcome(m, e, b) == "REJECTED"
    e = copy.deepcopy(cert)
    e["claim"]["free"]["length"] = N - 1                  # fewer claimed than given: also refused
    with pytest.raises(BadInput):
        run_check(m, e)


def test_upto_zero_is_a_prediction(certs):
    """upto:0 is exactly the prediction on prefix + [query]."""
    m, cert = certs[0]
    e = copy.deepcopy(cert)
    e["claim"]["free"]["length"] = 0
    e["evidence"]["lengths"] = e["evidence"]["lengths"][:1]
    assert "length 0..0" in run_check(m, e, "mpmath").summary


def test_cli_upto(tmp_path, capsys):
    """`tcert overwhelm --free upto:N` writes a certificate tcert-check verifies; exit 4 names failing lengths."""
    t, c = tiny_neox1l(14, qk_scale=0.5)
    path = tmp_path / "m.safetensors"
    save_model(str(path), t, c)
    out = tmp_path / "u.json"
    base = ["overwhelm", "--model", str(path), "--prefix-ids", ",".join(["1"] * 20), "--query-id", "2",
            "--free", f"upto:{N}", "--out", str(out)]
    assert tcert(base + ["--method", "naive"]) == 4 and not out.exists()
    assert "failing lengths: 3" in capsys.readouterr().out
    assert tcert(base + ["--method", "tight", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["figures"]["failing"] == []
    for b in BACKENDS:
        ob = verify(str(out), str(path), b)
        cert = ob.certificate
        assert cert["claim"]["free"] == {"kind": "upto", "length": N}
    assert tcert(["overwhelm", "--model", str(path), "--query-id", "2", "--free", "upto:40", "--method", "naive",
                  "--out", str(out)]) == 2


SHARED_CASES = [(14, [1] * 20), (57, [3, 1, 4, 1, 5, 0, 2]), (0, [])]


def test_shared_tables_equal_per_length_head_tables():
    """UptoTables.heads(L) against head_tables() for every L, both modes and backends: the query score, fixed
    mass and value mean are the same enclosures (identical endpoints); the free score extremes come from
    products of differently stacked matrices, which the exact product layer (flint's default) rounds on
    a grid set by the stacked matrix, so they agree to rounding (2^-50 relative; identical with Arb's own
    products); the value extremes enclose the same reals by another formula (x_t M - u M, resp. the norm
    identity), so they agree to rounding likewise; the deviation W from equal betas agrees likewise."""
    n = 4
    for seed, prefix in SHARED_CASES:
        m = model_of(*tiny_neox1l(seed, qk_scale=0.5))
        allowed = list(range(m.config.d_vocab))
        for mode in ("table", "norm"):
            for backend in BACKENDS:
                B = make_backend(backend)
                W = Weights(B, m)
                shared = UptoTables(B, m, prefix, 2, n, mode, allowed, W)
                for L in range(1, n + 1):
                    ref = head_tables(B, m, prefix, 2, allowed, L, mode, (), W)
                    got = shared.heads(L)
                    for r, g in zip(ref, got):
                        for x, y in [(r.lq, g.lq), (r.alpha_fix, g.alpha_fix)] + list(zip(r.u, g.u)):
                            assert (B.lower(x), B.upper(x)) == (B.lower(y), B.upper(y)), (seed, mode, backend, L)
                        for a, b in zip(r.score_lo + r.score_hi, g.score_lo + g.score_hi):
                            assert abs(a - b) <= Fraction(1, 2 ** 50) * (1 + abs(a)), (seed, mode, backend, L)
                        for a, b in zip(r.evou_lo + r.evou_hi, g.evou_lo + g.evou_hi):
                            assert abs(a - b) <= Fraction(1, 2 ** 50) * (1 + abs(a)), (seed, mode, backend, L)
                    beta = [beta_bounds(B, hd, *naive_free_mass(B, hd)) for hd in ref]
                    w_ref, w_got = (deviation_bound(B, m, heads, beta)[0] for heads in (ref, got))
                    assert abs(w_ref - w_got) <= Fraction(1, 2 ** 50) * (1 + w_ref)


def verdict(fn):
    """('VERIFIED', None) or ('REJECTED', obligation) of a check call."""
    try:
        fn()
        return "VERIFIED", None
    except Rejected as e:
        return "REJECTED", e.obligation


def test_shared_path_gives_the_per_length_verdicts():
    """check_fixed_length with the shared tables and without (head_tables per length) give the same verdict
    and rejecting obligation on every length's evidence (forced, float hints: Overwhelmed and
    Inconclusive lengths both occur), both modes and backends."""
    n, seen = 3, set()
    for seed, prefix in SHARED_CASES:
        m = model_of(*tiny_neox1l(seed, qk_scale=0.5))
        for mode in ("table", "norm"):
            evid = {}
            for L in range(1, n + 1):
                cert, rep = generate(m, prefix, 2, ("any", L, None), "naive", mode, "float", force=True)
                evid[L] = (cert["claim"]["predicted"], cert["evidence"])
            for backend in BACKENDS:
                B = make_backend(backend)
                W = Weights(B, m)
                shared = {mode: UptoTables(B, m, prefix, 2, n, mode, list(range(m.config.d_vocab)), W)}
                for L, (k, e) in evid.items():
                    run = lambda s: check_fixed_length(m, prefix, 2, k, L, None, e, B, Obligations(), W, s)
                    a, b = verdict(lambda: run(None)), verdict(lambda: run(shared))
                    assert a == b, (seed, mode, backend, L, a, b)
                    seen.add(a[0])
    assert seen == {"VERIFIED", "REJECTED"}


def test_generator_shared_float_tables_equal_per_length():
    """tcert.generator.overwhelm.upto.Shared.float_tables(L) = float_tables for any:L (to float rounding)."""
    n = 4
    for seed, prefix in SHARED_CASES:
        m = model_of(*tiny_neox1l(seed, qk_scale=0.5))
        shared = Shared(m, prefix, 2, n, "norm")
        for L in range(1, n + 1):
            ref = float_tables(FloatModel(m), prefix, 2, list(range(m.config.d_vocab)), L)
            got = shared.float_tables(L)
            for key in ("lq", "alpha_fix", "u", "values", "S"):
                assert got[key].shape == ref[key].shape
                assert np.allclose(got[key], ref[key], rtol=1e-12, atol=1e-12), (seed, L, key)
