"""Local influence certificates (claim form {"local": ...}): exhaustive rigorous oracle on tiny 1-layer
models (every single substitution, and every set of R substitutions, at every non-final position), mutation
of every claimed number, both backends, refusals."""

import copy
import itertools
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.local import (exact_gaps, gap_floor, gaps, local_parts, movement, multi_floors,
                                                 projections, safety_radius, unscreened)
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify
from tcert.generator import certificate
from tcert.generator.influence import toy_model
from tcert.generator.influence.local import local_certificate
from tcert.generator.model.files import save_model
from tcert.generator.model.forward import residuals

MODELS = {
    "rotary-parallel": dict(rotary=True, parallel=True, d_head=4),
    "nope-attnonly-bidir": dict(nope=True, attn_only=True, attention="bidirectional", ln=True),
    "nope-parallel-noLN": dict(nope=True, parallel=True, ln=False, final_ln=False),
    "rotary-sharp": dict(rotary=True, parallel=True, d_head=4, scale=0.8, seed=6),   # R = 4 by saturation
}


def tiny(tmp_path, **kw):
    kw = {"n_layers": 1, "d_vocab": 3, "n_ctx": 6, "d_model": 6, "n_heads": 2, "d_head": 3, "d_mlp": 8,
          "scale": 0.6, "eps": "1/10", **kw}
    t, cfg = toy_model(**kw)
    path = str(tmp_path / "m.safetensors")
    save_model(path, t, cfg)
    return path, load_model(path)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exhaustive_local_soundness(tmp_path, name):
    """For an input x of length 5: every single substitution moves y by <= change and p by <= change_prob;
    for every R, every set of R substitutions moves every logit gap l_k - l_j by <= G movement(R), and leaves
    it >= the per-competitor floor (`multi_floors`, every j listed); every single change's smallest gap is
    >= `exact_gaps` (met to 1e-9: the rule is exact) and > 0 where the safety radius screens it (rigorous Arb
    at 100 bits); the bounds are not vacuous (the worst single change reaches 5%; on the sharp model every
    competitor's floor stays > 0 for every R: the heads saturate)."""
    path, model = tiny(tmp_path, **MODELS[name])
    B = make_backend("flint", 100)
    W = Weights(B, model)
    x = [0, 2, 1, 1, 0]
    parts = local_parts(make_backend("flint"), model, x)
    y0, l0 = final_residual(B, model, x, W), last_logits(B, model, x, W)
    p0 = softmax(B, l0)
    k = max(range(3), key=lambda j: B.lower(l0[j]))
    columns = parts["unembed"].T
    from tcert.checker.kinds.influence.norms import max_row_dist
    G = max_row_dist(make_backend("flint"), columns, columns.rows()[k])
    B0, cands = make_backend("flint"), [j for j in range(3) if j != k]
    gs, (w, unorms) = gaps(B0, model, parts, k), projections(B0, model, parts, k, cands)
    worst = Fraction(0)
    pairs = [[j, t] for j in range(len(x) - 1) for t in range(3)]
    exact = {(j, t): g for (j, t), g in zip(pairs, exact_gaps(B0, model, parts, k, pairs))}
    screened = {(j, t) for j, t in pairs} - {(j, t) for j, t in unscreened(parts, safety_radius(B0, parts, gs, k))}
    for R in range(1, len(x)):
        bound = G * movement(parts, R)
        floors = {b: gap_floor(B0, parts, gs[b], d, R) for b, d in zip(cands, multi_floors(B0, parts, w, unorms, R))}
        assert name != "rotary-sharp" or min(floors.values()) > 0, (R, floors)
        for S in itertools.combinations(range(len(x) - 1), R):
            for toks in itertools.product(range(3), repeat=R):
                x2 = list(x)
                for pos, tok in zip(S, toks):
                    x2[pos] = tok
                y2, l2 = final_residual(B, model, x2, W), last_logits(B, model, x2, W)
                for j in range(3):
                    assert B.upper(abs((l0[k] - l0[j]) - (l2[k] - l2[j]))) <= bound, (R, S, toks)
                for b in cands:
                    assert B.upper(l2[k] - l2[b]) >= floors[b], (R, S, toks, b)
                if R == 1:
                    true_min = min(B.upper(l2[k] - l2[b]) for b in cands)
                    assert Fraction(0) <= true_min - exact[S[0], toks[0]] < Fraction(1, 10 ** 9), (S, toks)
                    assert (S[0], toks[0]) not in screened or true_min > 0
                    dy = B.upper(B.sqrt(B.num(max(B.upper(B.fsum((a - b) * (a - b) for a, b in zip(y0, y2))), 0))))
                    dp = sum(B.abs_upper(a - b) for a, b in zip(p0, softmax(B, l2)))
                    assert dy <= parts["change"] and dp <= parts["change_prob"], (S, toks)
                    worst = max(worst, dy / parts["change"])
    assert worst > Fraction(1, 20)


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_difference_minima_bound_the_column_differences_exactly(backend):
    """exact_backend.difference_minima: per column b, a lower bound of min_r ((x w)[r, k] - (x w)[r, b]) (and per
    row r, of min_(b != k)) within 1e-12 of the exact value, for an interval x (a ball, several row blocks) and a
    point x (ends), on float32 weights (exact differences) and float64 ones (the interval fallback); Rejected when
    the weights are not finite."""
    import numpy as np
    from tcert.checker.exact_backend import column_differences, difference_minima
    rng, B = np.random.default_rng(3), make_backend(backend)
    X, M, W64 = rng.normal(size=(37, 5)), rng.normal(size=(5, 5)), rng.normal(size=(5, 9))
    W = W64.astype(np.float32)
    assert column_differences(W, 0) is not None and column_differences(W64, 0) is None

    def exact(a, b):        # the exact product of two matrices of floats or Fractions (lists of Fractions)
        return [[sum(Fraction(p if isinstance(p, Fraction) else float(p)) * Fraction(float(q)) for p, q in zip(row, col)) for col in zip(*b)] for row in a]

    for weights in (W, W64):
        for x, xs in ((B.array(X) @ B.array(M), exact(exact(X, M), weights)), (B.array(X), exact(X, weights))):
            for k in (0, 4):
                got = difference_minima(x, weights, k, B, rows=8)
                for b in (b for b in range(9) if b != k):
                    true = min(r[k] - r[b] for r in xs)
                    assert got[b] <= true and true - got[b] < Fraction(1, 10 ** 12), (k, b)
                got = difference_minima(x, weights, k, B, rows=8, per_row=True)   # per row, over b != k
                for r, row in enumerate(xs):
                    true = min(row[k] - row[b] for b in range(9) if b != k)
                    assert got[r] <= true and true - got[r] < Fraction(1, 10 ** 12), (k, r)
    W[1, 2] = np.inf
    with pytest.raises(Rejected, match="finite"):
        difference_minima(B.array(X), W, 0, B)
    big = difference_minima(B.array(np.full((3, 2), 1e308)), np.array([[4.0, -4.0], [4.0, -4.0]], np.float32), 0, B)
    assert big[1] <= 16 * Fraction(1e308)          # past float64's range the bound stays below the exact 1.6e309


def test_local_certificate_verifies_backends_agree_and_mutations_rejected(tmp_path):
    """R = 3 of at most 4 (R = 4 is refused), both competitors along their own direction (the saturation rule of
    `multi_floors`; the coarse rule G lip_f D fails for each): dropping either is REJECTED, malformed lists are
    BadInput, every claimed number is checked, both backends agree."""
    path, model = tiny(tmp_path, **MODELS["rotary-parallel"], scale=0.3, seed=8)
    x = [2, 2, 2, 2, 2]
    cert, info = local_certificate(model, x)
    assert cert is not None and info["R"] == 3 and cert["claim"]["local"]["competitors"] == [1, 2], info
    import json
    import jsonschema
    from tcert.testing import ROOT
    schema = json.loads((ROOT / "docs" / "certificate.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(certificate.dumps(cert)))
    figs = {}
    for backend in ("flint", "mpmath"):
        ob = verify(cert, path, backend)
        figs[backend] = {key: ob.figure(f"claim.local.{key}") for key in ("change", "change_prob", "movement",
                                                                             "gap_floor")}
        assert "survives ANY change" in ob.summary
    for key in figs["flint"]:   # the two backends' recomputed needs agree to 1e-12 relative
        a, b = figs["flint"][key], figs["mpmath"][key]
        assert abs(a - b) <= Fraction(1, 10 ** 12) * max(a, b)
    shrink = 1 - Fraction(1, 2 ** 20)
    for key in ("change", "change_prob", "gap_lipschitz"):
        bad = copy.deepcopy(cert)
        bad["claim"]["local"][key] = certificate.num(parse_number(bad["claim"]["local"][key], key) * shrink)
        with pytest.raises(Rejected, match=f"influence local: {key}" if key != "gap_lipschitz" else "gap_lipschitz"):
            verify(bad, path)
    if info["R"] < len(x) - 1:
        bad = copy.deepcopy(cert)
        bad["claim"]["local"]["substitutions"] = info["R"] + 1
        with pytest.raises(Rejected, match="R changes cannot close the gap"):
            verify(bad, path)
    for kept, dropped in ((2, 1), (1, 2)):   # a listed competitor left to the coarse rule G lip_f D: its gap is too small
        bad = copy.deepcopy(cert)
        bad["claim"]["local"]["competitors"] = [kept]
        with pytest.raises(Rejected, match=f"competitor {dropped} \\(not listed\\): G\\*lip\\*movement = "):
            verify(bad, path)
    for competitors in ([1, 1], [1, info["predicted"]], [1, 3], ["1"], 1):
        bad["claim"]["local"]["competitors"] = competitors
        with pytest.raises(BadInput, match="claim.local.competitors"):
            verify(bad, path)
    bad = copy.deepcopy(cert)
    bad["claim"]["local"]["prediction"]["margin"] = certificate.num(
        parse_number(bad["claim"]["local"]["prediction"]["margin"], "m") * 2)
    with pytest.raises(Rejected, match="prediction logit gap"):
        verify(bad, path)


def test_local_exact_changes_verify_backends_agree_and_mutations_rejected(tmp_path):
    """R = 1 by the exact single-change rule: the listed changes are the ones the safety radius does not
    screen; dropping any one is REJECTED (named, with its numbers), malformed lists are BadInput, both backends
    agree on the figures."""
    path, model = tiny(tmp_path, **MODELS["rotary-parallel"], scale=0.8, seed=4)
    x = [2, 2, 2, 2, 2]
    cert, info = local_certificate(model, x, 1)
    changes = cert["claim"]["local"]["exact_changes"]
    assert cert is not None and info["R"] == 1 and len(changes) == 4, info
    figs = {}
    for backend in ("flint", "mpmath"):
        ob = verify(cert, path, backend)
        figs[backend] = [ob.figure(f"claim.local.{key}") for key in ("safety_radius", "gap_floor")]
    assert all(abs(a - b) <= Fraction(1, 10 ** 12) * abs(a) for a, b in zip(*figs.values())), figs
    for i, (j, t) in enumerate(changes):
        bad = copy.deepcopy(cert)
        del bad["claim"]["local"]["exact_changes"][i]
        with pytest.raises(Rejected, match=f"change \\(position {j}, token {t}\\) not listed: lip_f\\*N = "):
            verify(bad, path)
    for value in (changes + changes[:1], [[4, 0]], [[0, 3]], [[0]], [0, 1], "x"):
        bad = copy.deepcopy(cert)
        bad["claim"]["local"]["exact_changes"] = value
        with pytest.raises(BadInput, match="claim.local.exact_changes"):
            verify(bad, path)


def test_local_refusals(tmp_path):
    """One layer: learned positions, sequential blocks, extra fields: one-line BadInput each (two layers:
    test_local_layers.py)."""
    path, model = tiny(tmp_path, **MODELS["rotary-parallel"], scale=0.3, seed=4)
    cert, _ = local_certificate(model, [2, 2, 2, 2, 2])
    for i, kw in enumerate((dict(parallel=True), dict(rotary=True, d_head=4))):
        (tmp_path / str(i)).mkdir()
        other, other_model = tiny(tmp_path / str(i), **kw)
        bad = certificate.envelope("influence", other_model, cert["claim"], {})
        with pytest.raises(BadInput, match="claim.local: 1-layer models need"):
            verify(bad, other)
    for where, extra in (("claim", {"C": "1"}), ("local", {"junk": 1}), ("evidence", {"power": 2})):
        bad = copy.deepcopy(cert)
        {"claim": bad["claim"], "local": bad["claim"]["local"], "evidence": bad["evidence"]}[where].update(extra)
        with pytest.raises(BadInput):
            verify(bad, path)


def test_local_cli(tmp_path, capsys):
    from tcert.generator.cli import main
    path, _ = tiny(tmp_path, **MODELS["rotary-parallel"], scale=0.3, seed=8)
    out = str(tmp_path / "local.json")
    assert main(["influence", "--model", path, "--local", "--tokens", "2,2,2,2,2", "--out", out]) == 0
    assert "survives any 3" in capsys.readouterr().out
    verify(out, path)
    assert main(["influence", "--model", path, "--local", "--tokens", "2,2,2,2,2", "--substitutions", "4",
                 "--out", out]) == 4


@pytest.mark.parametrize("kw", [dict(rotary=True, parallel=True, d_head=4), dict(n_layers=2, attention="bidirectional")])
def test_structured_search_stays_below_the_global_bound(tmp_path, kw):
    """The structured search (tightness tables) finds a real change, never above the certified bound."""
    from tcert.generator.influence import influence_certificate
    from tcert.generator.influence.search import structured_influence
    from tcert.checker.kinds.influence import rate
    path, model = tiny(tmp_path, **kw)
    cert = influence_certificate(model)
    verify(cert, path)
    c = {k: parse_number(cert["claim"][k], k) for k in ("C", "C_abs")}
    for n in (2, 6):
        dy, _ = structured_influence(model, n, starts=2, rounds=1, pool=3, seed=n)
        assert 0 < dy <= min(c["C"] * rate(cert["claim"]["rate"], n, model.config.n_layers), c["C_abs"])


def test_exhaustive_pairs_and_fragile_tokens(tmp_path):
    """`exhaustive_pairs` over every last token is the brute-force worst single change at n = 2 (each pair's
    distance from `residuals`), and below the certified bound; `fragile_tokens` ranks tokens by the centred norm
    of their residual entering the last block; the structured search seeded with them finds a real change."""
    from tcert.generator.influence import influence_certificate
    from tcert.generator.influence.search import exhaustive_pairs, fragile_tokens, sharp_seeds, structured_influence
    path, model = tiny(tmp_path, n_layers=2, rotary=True, parallel=True, d_head=4, d_vocab=5)
    V = model.config.d_vocab
    brute = max((float(np.linalg.norm(residuals(model, np.array([a, q]))[-1][-1]
                                      - residuals(model, np.array([b, q]))[-1][-1])), (q, a, b))
                for q in range(V) for a in range(V) for b in range(V))
    dy, dp, arg = exhaustive_pairs(model, range(V))
    assert abs(dy - brute[0]) < 1e-12 and dy > 0 and 0 <= dp <= 2
    q, a, b = arg
    assert abs(float(np.linalg.norm(residuals(model, np.array([a, q]))[-1][-1]
                                    - residuals(model, np.array([b, q]))[-1][-1])) - dy) < 1e-12
    before_last = [residuals(model, np.array([t]))[1][0] for t in range(V)]
    norms = [float(np.linalg.norm(x - x.mean())) for x in before_last]
    assert list(fragile_tokens(model, V)) == sorted(range(V), key=lambda t: norms[t])
    t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
    x = t["embed.W_E"] - t["embed.W_E"].mean(axis=1, keepdims=True)
    u = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + 0.1) * t["blocks.0.ln1.w"] + t["blocks.0.ln1.b"]
    for h, (f, q) in enumerate(sharp_seeds(model)):
        S = (u @ t["blocks.0.attn.W_Q"][h] + t["blocks.0.attn.b_Q"][h]) @ (u @ t["blocks.0.attn.W_K"][h]
                                                                            + t["blocks.0.attn.b_K"][h]).T
        assert q == int(np.argmax(S.max(axis=1) - S.min(axis=1))) and f == int(np.argmin(S[q]))
    cert = influence_certificate(model)
    C_abs = parse_number(cert["claim"]["C_abs"], "C_abs")
    assert dy <= C_abs
    found, _, (f, q, i, a, b) = structured_influence(model, 4, starts=2, rounds=1, pool=V, seed=1,
                                                     queries=fragile_tokens(model, 2), seeds=[(0, 1)], witness=True)
    assert 0 < found <= C_abs
    x, x2 = np.array([f, f, f, q]), np.array([f, f, f, q])
    x[i], x2[i] = a, b
    assert abs(float(np.linalg.norm(residuals(model, x)[-1][-1] - residuals(model, x2)[-1][-1])) - found) < 1e-12


def test_local_cost_estimate_counts_the_per_token_rule(tmp_path):
    """The resource model estimates the local rule (heads x positions x tokens) before any work: a limit
    below the estimate refuses in one line (BadInput), the default verifies."""
    from tcert.checker.kinds.influence.cost import cost
    from tcert.checker.resources import Limits
    path, model = tiny(tmp_path, **MODELS["rotary-parallel"], scale=0.3, seed=4)
    cert, _ = local_certificate(model, [2, 2, 2, 2, 2])
    est = cost(model.config, cert["claim"], cert["evidence"])
    assert "local influence certificate (n = 5)" in est.what
    short = copy.deepcopy(cert)
    short["claim"]["local"]["prediction"]["tokens"] = [2, 2]
    assert cost(model.config, short["claim"], {}).work < est.work
    with pytest.raises(BadInput, match="resource limit"):
        verify(cert, path, limits=Limits(work=est.work / 2))
    verify(cert, path)
