"""Overwhelm certificates: shipped certificate, mutations, claim edits, LP vs naive, CLI behaviour."""

import copy
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.assignment import assignment_bound
from tcert.checker.kinds.overwhelm.naive_lp import lp_costs, naive_free_mass
from tcert.checker.kinds.overwhelm.tables import head_tables
from tcert.checker.verify import verify
from tcert.checker.envelope import parse_certificate_bytes
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_number
from tcert.generator.certificate import format_number
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.mpmath_backend import MpmathBackend
from tcert.checker.kinds.overwhelm import check
from tcert.checker.modelfile import load_model
from tcert.checker.obligations import Obligations
from tcert.testing import CERTIFICATES
from tcert.testing.regeneration import float_differences
from tcert.generator.cli import main as tcert
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.overwhelm.naive_lp import generate
from tcert.testing.overwhelm import Oracle, exhaustive_confirms, model_of, tiny_neox1l

SHIP = CERTIFICATES / "overwhelm"
MODEL, CERT = SHIP / "neox1l_tiny.safetensors", SHIP / "perm_lp.json"
BACKENDS = ("flint", "mpmath")


def run_check(model, cert, backend="flint"):
    """The kind's check on an in-memory certificate; returns the Obligations."""
    ob = Obligations()
    check(model, cert["claim"], cert["evidence"], make_backend(backend), ob)
    return ob


@pytest.fixture(scope="module")
def shipped():
    with open(CERT, "rb") as f:
        return load_model(str(MODEL)), parse_certificate_bytes(f.read())


@pytest.fixture(scope="module")
def small_certs():
    """A few generated certificates on tiny models covering any/perm, naive/lp, table/norm."""
    out = []
    for seed, n_fix, spec, method, vb in [(6, 20, ("perm", 3, [0, 3, 4]), "lp", "table"),
                                          (14, 20, ("any", 2, None), "naive", "table"),
                                          (57, 20, ("perm", 3, [0, 3, 4]), "lp", "norm"),
                                          (0, 36, ("perm", 2, [0, 3]), "naive", "norm"),
                                          (0, 36, ("any", 1, None), "naive", "norm")]:
        t, c = tiny_neox1l(seed, qk_scale=0.5)
        m = model_of(t, c)
        cert, rep = generate(m, [1] * n_fix, 2, spec, method, vb, "tight")
        assert cert is not None, (seed, spec, method, rep["verdict"])
        out.append((m, cert))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_shipped_certificate_verifies(backend, shipped):
    ob = verify(str(CERT), str(MODEL), backend)
    cert = ob.certificate
    assert cert["kind"] == "overwhelm" and "every permutation of 4 tokens" in ob.summary
    names = [o.name for o in ob.done]
    assert "overwhelm lp: head 0 assignment LP (min)" in names
    assert "overwhelm lp: scores, fixed masses, value extremes (table)" in names
    assert ob.figure("evidence.deviation") <= parse_number(cert["evidence"]["deviation"], "W")


def test_shipped_claim_is_true_exhaustively(shipped):
    model, cert = shipped
    c = cert["claim"]
    ok, gap = exhaustive_confirms(model, c["prefix"], c["query"], "perm", 4, c["free"]["tokens"], c["predicted"])
    assert ok and gap > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_lp_duals_survive_a_slightly_weaker_checker(shipped, backend, monkeypatch):
    """The generator repairs the lp duals against the certified costs moved outward by 2^-48 relative
    (generator RIGOROUS_MARGIN), so the shipped certificate still verifies when a checker's cost bounds are
    2^-50 weaker (a change of the checker's arithmetic, not of the model); 2^-30 weaker rejects it under
    the LP's dual feasibility, so the test would fail on duals tight to one ulp and on a margin that is
    ignored."""
    import tcert.checker.kinds.overwhelm.naive_lp as kind
    model, cert = shipped

    def weaker(by):
        def costs(B, hd, multiset):
            lo, hi = lp_costs(B, hd, multiset)
            return ([[x * (1 - by) for x in row] for row in lo], [[x * (1 + by) for x in row] for row in hi])
        return costs

    monkeypatch.setattr(kind, "lp_costs", weaker(Fraction(1, 1 << 50)))
    assert run_check(model, cert, backend) is not None
    monkeypatch.setattr(kind, "lp_costs", weaker(Fraction(1, 1 << 30)))
    with pytest.raises(Rejected, match="dual feasibility"):
        run_check(model, cert, backend)


def test_shipped_needs_the_lp(shipped):
    """On the shipped example the naive bound is Inconclusive, the LP bound Overwhelmed."""
    model, cert = shipped
    c = cert["claim"]
    spec = ("perm", 4, c["free"]["tokens"])
    naive_cert, naive = generate(model, c["prefix"], c["query"], spec, "naive")
    lp_cert, lp = generate(model, c["prefix"], c["query"], spec, "lp")
    assert naive_cert is None and lp_cert is not None and lp["deviation"] < naive["deviation"]
    broken = copy.deepcopy(cert)
    broken["evidence"]["method"] = "naive"
    del broken["evidence"]["lp_duals"]
    with pytest.raises(Rejected, match="deviation bound"):
        run_check(model, broken)


def test_model_binding(shipped, tmp_path):
    model, cert = shipped
    t, c = tiny_neox1l(5, d_vocab=12, d_model=16, n_heads=2, d_head=8, n_ctx=64, d_mlp=32)
    from tcert.generator.model.files import save_model
    other = tmp_path / "other.safetensors"
    save_model(str(other), t, c)
    with pytest.raises(Rejected, match="model binding"):
        verify(str(CERT), str(other))
    # the same certificate body checked against the other model's weights (binding bypassed) also fails
    with pytest.raises(Rejected):
        run_check(load_model(str(other)), cert)


def numeric_fields(evidence):
    """(path, unsafe direction) of every number in the evidence: +1 = raising it is unsafe."""
    out = [(("deviation",), -1), (("sample", "margin"), +1)]
    for h, entry in enumerate(evidence.get("lp_duals", [])):
        for sense, direction in (("min", +1), ("max", -1)):
            for vec in ("u", "v"):
                for i in range(len(entry[sense][vec])):
                    out.append((("lp_duals", h, sense, vec, i), direction))
    return out


def moved(cert, path, direction, rel):
    """A copy of cert with the number at evidence/path moved by rel * max(|x|, 1) in `direction`."""
    c = copy.deepcopy(cert)
    node = c["evidence"]
    for key in path[:-1]:
        node = node[key]
    x = parse_number(node[path[-1]], "x")
    node[path[-1]] = format_number(x + direction * rel * max(abs(x), 1))
    return c


# The lp duals keep a margin of 2^-48 of their costs (generator RIGOROUS_MARGIN; costs reach ~3e4 here, so
# ~1e-10 absolute): a smaller move of a dual stays feasible and rightly verifies, so duals move by >= 2^-30.
DUAL_MOVE = Fraction(1, 2 ** 30)


@pytest.mark.parametrize("rel", [Fraction(1, 2 ** 40), Fraction(1, 2 ** 20), Fraction(1, 4)])
def test_mutations_unsafe_direction_rejected(rel, shipped, small_certs):
    cases = [shipped] + small_certs
    count = 0
    for model, cert in cases:
        run_check(model, cert)                    # the unmutated certificate verifies
        for path, direction in numeric_fields(cert["evidence"]):
            step = max(rel, DUAL_MOVE) if path[0] == "lp_duals" else rel
            with pytest.raises(Rejected):
                run_check(model, moved(cert, path, direction, step))
            count += 1
    assert count >= 60


def test_mutations_safe_direction_still_verify(shipped):
    """Looser hints are still valid (weak duality, a smaller margin) once the claimed W leaves room."""
    model, cert = shipped
    roomy = moved(cert, ("deviation",), +1, Fraction(1, 2 ** 20))
    run_check(model, roomy)
    for path, direction in numeric_fields(cert["evidence"]):
        if path != ("deviation",):
            run_check(model, moved(roomy, path, -direction, Fraction(1, 2 ** 30)))


def claim_edits(cert, d_vocab):
    """Certificates with one claim field changed."""
    c = cert["claim"]
    edits = []

    def edit(fn):
        e = copy.deepcopy(cert)
        fn(e["claim"])
        edits.append(e)

    edit(lambda cl: cl.__setitem__("predicted", (c["predicted"] + 1) % d_vocab))
    edit(lambda cl: cl.__setitem__("query", (c["query"] + 1) % d_vocab))
    if c["prefix"]:
        edit(lambda cl: cl["prefix"].__setitem__(0, (c["prefix"][0] + 1) % d_vocab))
        edit(lambda cl: cl["prefix"].pop())
    edit(lambda cl: cl["prefix"].append(c["query"]))
    if c["free"]["kind"] == "perm":
        edit(lambda cl: cl["free"]["tokens"].__setitem__(0, (c["free"]["tokens"][0] + 1) % d_vocab))
        edit(lambda cl: cl["free"]["tokens"].append(c["free"]["tokens"][0]))
        if len(c["free"]["tokens"]) > 1:
            edit(lambda cl: cl["free"]["tokens"].pop())
        edit(lambda cl: cl.__setitem__("free", {"kind": "any", "length": len(c["free"]["tokens"])}))
    else:
        edit(lambda cl: cl["free"].__setitem__("length", c["free"]["length"] + 1))
        if c["free"]["length"] > 1:
            edit(lambda cl: cl["free"].__setitem__("length", c["free"]["length"] - 1))
    return edits


def test_claim_edits_rejected(shipped, small_certs):
    """Every claim edit is REJECTED; one that changes the multiset's size leaves LP duals of the wrong
    length, which is malformed evidence (BadInput) rather than a failed inequality."""
    n = 0
    for model, cert in [shipped] + small_certs:
        for edited in claim_edits(cert, model.config.d_vocab):
            resized = "lp_duals" in cert["evidence"] and len(edited["claim"]["free"].get("tokens", [])) != \
                len(cert["claim"]["free"].get("tokens", []))
            with pytest.raises(BadInput if resized else Rejected):
                run_check(model, edited)
            n += 1
    assert n >= 30


def test_any_with_wider_set_is_rejected_not_verified(small_certs):
    """A perm certificate relabelled as any:N must not verify (the sample check or W bound fails)."""
    model, cert = small_certs[0]
    e = copy.deepcopy(cert)
    e["claim"]["free"] = {"kind": "any", "length": 3}
    e["evidence"]["method"] = "naive"
    del e["evidence"]["lp_duals"]
    try:
        run_check(model, e)
        verified = True
    except Rejected:
        verified = False
    if verified:  # allowed only if really true on all of any:3
        c = e["claim"]
        assert exhaustive_confirms(model, c["prefix"], c["query"], "any", 3, None, c["predicted"])[0]


@pytest.mark.parametrize("seed", range(12))
def test_lp_equals_permutation_optimum_and_beats_naive(seed):
    """The repaired LP dual objective equals the brute-force extremum over permutations (the assignment LP
    is integral) and is never looser than the naive per-position bound; so is the generator's W."""
    t, c = tiny_neox1l(seed, d_vocab=7, n_heads=2, qk_scale=1.0, adjacent=seed % 2 == 1)
    model = model_of(t, c)
    rng = np.random.default_rng(seed)
    multiset = [int(x) for x in rng.integers(0, 7, 4)]
    prefix = [int(x) for x in rng.integers(0, 7, 5)]
    cert_lp, lp = generate(model, prefix, 3, ("perm", 4, multiset), "lp", "table", "float")
    cert_nv, nv = generate(model, prefix, 3, ("perm", 4, multiset), "naive", "table", "float")
    assert lp["deviation"] <= nv["deviation"] * (1 + 1e-12)
    B = make_backend("flint")
    allowed = sorted(set(multiset))
    heads = head_tables(B, model, prefix, 3, allowed, 4, "table", set(multiset))
    from tcert.generator.overwhelm.assignment import repair, solve_assignment
    for hd in heads:
        lo, hi = lp_costs(B, hd, multiset)
        perms = list(itertools.permutations(range(4)))
        exact_min = min(sum(lo[p[c]][c] for c in range(4)) for p in perms)
        exact_max = max(sum(hi[p[c]][c] for c in range(4)) for p in perms)
        C = np.array([[float(x) for x in row] for row in lo])
        _, _, v = solve_assignment(C, "min")
        u, v, val = repair(v, lo, "min")
        assert assignment_bound([Fraction(x) for x in u], [Fraction(x) for x in v], lo, "min") == val
        assert abs(val - exact_min) <= Fraction(1, 10 ** 9) * exact_min
        _, _, v = solve_assignment(np.array([[float(x) for x in row] for row in hi]), "max")
        u, v, val = repair(v, hi, "max")
        assert abs(val - exact_max) <= Fraction(1, 10 ** 9) * exact_max
        nmin, nmax = naive_free_mass(B, hd)
        assert nmin <= exact_min * (1 + Fraction(1, 10 ** 12)) and exact_max <= nmax * (1 + Fraction(1, 10 ** 12))


def test_lp_dual_infeasible_rejected(shipped):
    model, cert = shipped
    e = copy.deepcopy(cert)
    e["evidence"]["lp_duals"][0]["min"]["u"][0] = "1000"
    with pytest.raises(Rejected, match="dual feasibility"):
        run_check(model, e)


def test_oracle_matches_float_forward_and_interval_forward():
    """The soundness oracle agrees with the float forward pass and lies inside the checker's enclosure."""
    t, c = tiny_neox1l(9, d_vocab=5, n_heads=3, rotary_dim=2, adjacent=True, attn_scale="5")
    model = model_of(t, c)
    orc = Oracle(model)
    seq = [1, 4, 0, 0, 3, 2]
    hi_prec = orc.logits(seq)
    assert np.max(np.abs(np.array([float(x) for x in hi_prec]) - float_logits(model, np.array([seq]))[0])) < 1e-9
    B = MpmathBackend(prec=110)
    for x, enc in zip(hi_prec, last_logits(B, model, seq)):
        sign, man, exp, _ = x._mpf_
        exact = (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)
        assert B.lower(enc) - Fraction(1, 2 ** 90) <= exact <= B.upper(enc) + Fraction(1, 2 ** 90)


def test_unsupported_architecture_is_bad_input(shipped):
    model, cert = shipped
    t, c = tiny_neox1l(1)
    c = dict(c, parallel_attn_mlp=False)
    with pytest.raises(BadInput, match="neox1l"):
        run_check(model_of(t, c), cert)


def test_value_table_over_the_limit_is_bad_input_before_any_work():
    """A vocabulary whose exact centred EVOU table (allowed tokens x d_vocab x heads) exceeds the limit:
    value_bound table (naive), method tight and upto's shared tables are BadInput naming the evidence,
    the fixed-length ones before any obligation runs (no sample forward pass, no tables)."""
    from tcert.checker.kinds.overwhelm.tables import MAX_TABLE_ENTRIES
    d_vocab = 5800
    assert d_vocab * d_vocab > MAX_TABLE_ENTRIES
    model = model_of(*tiny_neox1l(3, d_vocab=d_vocab, n_heads=1))
    sample = {"tokens": [1, 1, 2], "predicted": 0, "margin": "1"}
    claim = {"prefix": [1], "query": 2, "predicted": 0, "free": {"kind": "any", "length": 1}}
    naive = {"method": "naive", "value_bound": "table", "deviation": "1", "sample": sample}
    for evidence, message in ((naive, r"evidence\.value_bound: 'table' would need more than"),
                              ({"method": "tight", "exact": []}, "overwhelm tight: the centred EVOU table would exceed")):
        ob = Obligations()
        with pytest.raises(BadInput, match=message):
            check(model, claim, evidence, make_backend("flint"), ob)
        assert ob.done == []
    from tcert.generator.prediction import prediction_claim
    length0, p = prediction_claim(model, [1, 2])   # a true length-0 claim: the check gets to the shared tables
    upto = dict(claim, predicted=p["predicted"], free={"kind": "upto", "length": 1})
    lengths = [length0, naive]
    with pytest.raises(BadInput, match=r"evidence\.lengths: value_bound 'table' would need more than"):
        check(model, upto, {"lengths": lengths}, make_backend("flint"), Obligations())


def test_evidence_shape_errors(shipped):
    model, cert = shipped
    for mutate in (lambda e: e.pop("deviation"), lambda e: e.__setitem__("method", "magic"),
                   lambda e: e.__setitem__("extra", 1), lambda e: e["lp_duals"].pop(),
                   lambda e: e["lp_duals"][0]["min"].__setitem__("u", "x")):
        e = copy.deepcopy(cert)
        mutate(e["evidence"])
        with pytest.raises((BadInput, Rejected)):
            run_check(model, e)
    e = copy.deepcopy(cert)   # a dual vector of the wrong length is malformed, not a failed inequality
    e["evidence"]["lp_duals"][0]["min"]["u"].pop()
    with pytest.raises(BadInput, match=r"evidence\.lp_duals\[0\]\.min\.u"):
        run_check(model, e)


def test_cli_writes_only_when_overwhelmed(shipped, tmp_path, capsys):
    model, cert = shipped
    c = cert["claim"]
    prefix = ",".join(str(x) for x in c["prefix"])
    perm = "perm:" + ",".join(str(x) for x in c["free"]["tokens"])
    out = tmp_path / "c.json"
    code = tcert(["overwhelm", "--model", str(MODEL), "--prefix-ids", prefix, "--query-id", str(c["query"]),
                  "--free", perm, "--method", "naive", "--out", str(out)])
    assert code == 4 and not out.exists() and "Inconclusive" in capsys.readouterr().out
    code = tcert(["overwhelm", "--model", str(MODEL), "--prefix-ids", prefix, "--query-id", str(c["query"]),
                  "--free", perm, "--method", "lp", "--out", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)["figures"]
    assert code == 0 and report["verdict"] == "Overwhelmed"
    # deterministic: regenerates the shipped file, but for the command line it records (this run's --out and
    # --json; tests/soundness/test_determinism.py re-runs the recorded command itself, byte for byte)
    made, shipped_cert = json.loads(out.read_text()), json.loads(CERT.read_text())
    assert made["generator"].pop("command")[-3:] == ["--out", str(out), "--json"]
    shipped_cert["generator"].pop("command")
    assert float_differences(shipped_cert, made) == []     # equal but for another machine's BLAS last bits
    assert tcert(["overwhelm", "--model", str(MODEL), "--query-id", "99", "--free", "any:2", "--out", str(out)]) == 2


def test_demo_section(tmp_path):
    from tcert.generator.overwhelm.cli import demo_section
    assert demo_section(None, str(tmp_path), "flint")
    ob = verify(str(tmp_path / "overwhelm.json"), str(MODEL), "mpmath")
    assert math.isfinite(sum(o.seconds for o in ob.done))


@pytest.mark.parametrize("backend", BACKENDS)
def test_col_bounds_groups(backend):
    """IMat.col_bounds(groups) equals col_bounds of each row block, and encloses every entry."""
    B = make_backend(backend)
    rng = np.random.default_rng(3)
    a = rng.normal(size=(6, 5))
    M = B.array(a).scale(B.num(1) / 3)
    blocks = M.col_bounds(3)
    assert len(blocks) == 3 and len(M.col_bounds(1)) == 1
    for g, (lo, hi) in enumerate(blocks):
        ref = B.array(a[2 * g:2 * g + 2]).scale(B.num(1) / 3).col_bounds()
        assert (lo, hi) == ref
        for j in range(5):
            exact = [Fraction(x) / 3 for x in a[2 * g:2 * g + 2, j]]
            assert lo[j] <= min(exact) and max(exact) <= hi[j]


def test_cli_text_options(capsys, tmp_path):
    """--prefix-text/--query-text/--free perm-text: go through the tokenizer the model file names."""
    from tcert.generator.train.text_data import encode, model_tokenizer
    path = str(CERTIFICATES / "models" / "text_small.safetensors")
    tok = model_tokenizer(path, load_model(path).config.tokenizer_name)
    prefix, free = "the president said on monday that the", "new york city"
    code = tcert(["overwhelm", "--model", path, "--prefix-text", prefix, "--query-text", "the",
                  "--free", "perm-text:" + free, "--out", str(tmp_path / "t.json"), "--json"])
    report = json.loads(capsys.readouterr().out)["figures"]
    assert code in (0, 4) and (code == 0) == (tmp_path / "t.json").exists()
    assert report["n_fix"] == len(encode(tok, prefix)) and report["n_free"] == len(encode(tok, free))


@pytest.mark.parametrize("seed,spec,method", [(6, ("perm", 3, [0, 3, 4]), "lp"), (14, ("any", 2, None), "naive")])
def test_float_hints_verify_on_both_backends(seed, spec, method):
    """The large-model path (float64 hints with 2^-30 slack, no rigorous work in the generator) yields
    certificates both backends accept; the tight hints are never looser than the float ones."""
    t, c = tiny_neox1l(seed, qk_scale=0.5)
    m = model_of(t, c)
    cert, rep = generate(m, [1] * 20, 2, spec, method, "auto", "float")
    tight, rep_t = generate(m, [1] * 20, 2, spec, method, "auto", "tight")
    assert cert is not None and rep["hints"] == "float" and rep_t["hints"] == "tight"
    for b in BACKENDS:
        run_check(m, cert, b)
    assert rep_t["deviation"] <= rep["deviation"]
    assert parse_number(tight["evidence"]["sample"]["margin"], "m") >= parse_number(cert["evidence"]["sample"]["margin"], "m")
