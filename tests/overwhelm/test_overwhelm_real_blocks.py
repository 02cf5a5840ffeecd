"""Overwhelm on real GPT-NeoX blocks (issue 6, part 3): separate ln1/ln2, GELU, all biases, partial rotary and
a final LayerNorm (checker/kinds/overwhelm/final_ln.py, method tight only).

Soundness against the exhaustive 110-bit oracle (also for the certified sigma range of the final LN),
both backends, unsafe-direction edits of every new evidence field, the mutation harness, refusals
(naive/lp on final-LN models, sequential MLP), a GPT-NeoX checkpoint built with `transformers` taken
through `tcert model import` -> `tcert overwhelm --method tight` -> `tcert-check`, and the shipped
example certificates/overwhelm/neox_real_*.json.

`PYTHONPATH=. python tests/overwhelm/test_overwhelm_real_blocks.py` rewrites the shipped example (model and certificates).
"""

import contextlib
import copy
import io
import json
import os
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker.cli import main as check_main
from tcert.checker.verify import verify
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_number
from tcert.generator.certificate import format_number
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES, example_scale
from tcert.generator import certificate
from tcert.generator.cli import main as tcert_main
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tight import generate_tight
from tcert.testing.overwhelm import tight_scenarios
from tcert.testing.regeneration import float_differences
from tcert.testing.overwhelm import Oracle, exhaustive_confirms, free_strings, model_of, tiny_neox1l, tiny_neox_real, verdict

BACKENDS = ("flint", "mpmath")
SHIPPED_MODEL = CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors"
# (file, prefix, query, free spec) of the shipped example
SHIPPED = (("neox_real_perm.json", [0] * 12, 6, ("perm", 4, [1, 3, 3, 5])),
           ("neox_real_any2.json", [0] * 12, 7, ("any", 2, None)))


def sigma_range_holds(model, prefix, query, kind, n_free, multiset, cert) -> bool:
    """Every free string's pre-final-LN residual r has sigma(r) = sqrt(|P r|^2/d + eps) inside the
    certificate's [sigma_lo, sigma_hi] (110-bit oracle, with a 2^-80 relative guard)."""
    fl = cert["evidence"]["final_ln"]
    lo, hi = parse_number(fl["sigma_lo"], "lo"), parse_number(fl["sigma_hi"], "hi")
    orc, c = Oracle(model), model.config
    mp = orc.mp
    for t in free_strings(kind, n_free, multiset, c.d_vocab):
        r = orc.residual(list(prefix) + list(t) + [query])
        mu = mp.fsum(r) / c.d_model
        s = mp.sqrt(mp.fsum((x - mu) ** 2 for x in r) / c.d_model + mp.mpf(c.eps.numerator) / c.eps.denominator)
        guard = s * mp.mpf(2) ** -80
        if not (mp.mpf(lo.numerator) / lo.denominator <= s + guard and s - guard <= mp.mpf(hi.numerator) / hi.denominator):
            return False
    return True


def test_oracle_and_checker_forward_agree_on_real_blocks():
    """The test oracle (ln2, GELU/gelu_new/ReLU, final LN) lies inside the checker's 110-bit interval
    logits and near the float forward pass."""
    B = make_backend("mpmath", 110)
    for seed, act in ((0, "gelu"), (1, "gelu_new"), (2, "relu")):
        m = model_of(*tiny_neox_real(seed, act_fn=act))
        toks = [3, 1, 4, 1, 5, 2]
        orc = Oracle(m).logits(toks)
        enc = last_logits(B, m, toks)
        flt = float_logits(m, np.asarray([toks]))[0]
        for o, e, f in zip(orc, enc, flt):
            assert B.lower(e) - Fraction(1, 2 ** 90) <= Fraction(str(o)) <= B.upper(e) + Fraction(1, 2 ** 90)
            assert abs(float(o) - f) < 1e-9


@st.composite
def scenarios(draw):
    """The tight tests' random question (tests/overwhelm/test_overwhelm_tight.py) on a real block: activation, bias
    scale and final-LN spread drawn on top of its model arguments."""
    s = draw(tight_scenarios())
    s["model_args"].update(act_fn=draw(st.sampled_from(["gelu", "gelu", "gelu_new", "relu"])),
                           bias_sc=draw(st.sampled_from([0.1, 0.3, 1.0])),
                           ln_f_sc=draw(st.sampled_from([0.1, 0.3, 1.0])))
    return s


def test_real_blocks_sound_on_both_backends():
    """Every VERIFIED tight certificate on a real block holds on all of T (110-bit oracle); both backends
    agree; whenever the checker got past the final-LN obligations, the certified sigma range holds on
    all of T. Certificates are written even when Inconclusive (force) so the rejecting paths run too."""
    stats = Counter()

    @settings(max_examples=example_scale(150), deadline=None)
    @given(scenarios())
    def prop(s):
        model = model_of(*tiny_neox_real(**s["model_args"]))
        spec = (s["kind"], s["n_free"], s["multiset"])
        cert, rep = generate_tight(model, s["prefix"], s["query"], spec, force=True, relax=s["relax"],
                                   exact_all=s["exact_all"])
        stats["examples"] += 1
        verdicts = {b: verdict(model, cert, b) for b in BACKENDS}
        assert (verdicts["flint"] == "VERIFIED") == (verdicts["mpmath"] == "VERIFIED"), verdicts
        assert (verdicts["flint"] == "VERIFIED") == (rep["verdict"] == "Overwhelmed"), (verdicts, rep)
        fl = cert["evidence"]["final_ln"]
        if "final LN" not in verdicts["flint"]:    # both sigma obligations passed
            assert sigma_range_holds(model, s["prefix"], s["query"], *spec, cert), fl
            stats["sigma range confirmed"] += 1
            stats["sigma_lo above sqrt(eps)"] += parse_number(fl["sigma_lo"], "") ** 2 > 2 * model.config.eps
        if verdicts["flint"] == "VERIFIED":
            stats["verified"] += 1
            stats["verified with exact competitors"] += rep["exact_competitors"] > 0
            stats["verified with variance duals"] += "duals" in fl["variance"]
            ok, gap = exhaustive_confirms(model, s["prefix"], s["query"], *spec, cert["claim"]["predicted"])
            assert ok, f"VERIFIED real-block certificate contradicted exhaustively (gap {gap}): {cert['claim']}"

    prop()
    print(dict(stats))
    n = stats["examples"]
    assert stats["verified"] >= 0.2 * n, stats
    assert stats["verified with exact competitors"] > 0 and stats["verified with variance duals"] > 0, stats
    assert stats["sigma range confirmed"] >= 0.8 * n and stats["sigma_lo above sqrt(eps)"] >= 0.5 * n, stats


@pytest.fixture(scope="module")
def tiny_real():
    """A tiny real-block model and two VERIFIED tight certificates (perm with duals everywhere, any)."""
    model = model_of(*tiny_neox_real(1))
    certs = {}
    for spec in (("perm", 3, [0, 3, 4]), ("any", 2, None)):
        cert, rep = generate_tight(model, [1] * 20, 2, spec, relax=False, exact_all=True)
        assert cert is not None, rep
        certs[spec[0]] = cert
    return model, certs


def scaled(cert, path, factor):
    """A copy of cert with the number at path (under evidence.final_ln) multiplied by factor."""
    out = copy.deepcopy(cert)
    obj = out["evidence"]["final_ln"]
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = format_number(parse_number(obj[path[-1]], "x") * factor)
    return out


def test_final_ln_fields_unsafe_edits_are_rejected(tiny_real):
    """sigma_lo up, sigma_hi down, a variance or cross-term lambda down, a variance or cross-term dual down,
    a flipped variance direction: REJECTED (same on both backends); the safe directions stay VERIFIED."""
    model, certs = tiny_real
    for kind, cert in certs.items():
        assert {b: verdict(model, cert, b) for b in BACKENDS} == {b: "VERIFIED" for b in BACKENDS}
        fl = cert["evidence"]["final_ln"]
        unsafe = [(("sigma_lo",), 1 + Fraction(1, 2 ** 20)), (("sigma_lo",), Fraction(5, 4)),
                  (("sigma_hi",), 1 - Fraction(1, 2 ** 20)), (("sigma_hi",), Fraction(3, 4)),
                  (("sigma_lo",), -1), (("sigma_hi",), -1), (("sigma_lo",), 0)]
        for key in ("variance", "cross_term"):
            for h, lam in enumerate(fl[key]["lambdas"]):
                x = parse_number(lam, "")
                unsafe.append(((key, "lambdas", h), 1 - Fraction(1, 2 ** 10) if x > 0 else 1 + Fraction(1, 2 ** 10)))
            if "duals" in fl[key]:
                assert kind == "perm"
                u0 = parse_number(fl[key]["duals"][0]["u"][0], "")
                unsafe.append(((key, "duals", 0, "u", 0), 1 - Fraction(1, 2 ** 10) if u0 > 0 else 1 + Fraction(1, 2 ** 10)))
        for path, factor in unsafe:
            bad = scaled(cert, path, factor)
            for b in BACKENDS:
                v = verdict(model, bad, b)
                assert v.startswith("REJECTED"), (kind, path, factor, b)
        flipped = copy.deepcopy(cert)
        flipped["evidence"]["final_ln"]["variance_direction"] = [format_number(-parse_number(x, ""))
                                                                 for x in fl["variance_direction"]]
        assert "final LN" in verdict(model, flipped, "flint")
        for path, factor in ((("sigma_lo",), Fraction(1, 2)), (("sigma_hi",), 2)):
            assert verdict(model, scaled(cert, path, factor), "flint") == "VERIFIED", path


def test_final_ln_evidence_shape_and_refusals(tiny_real):
    """final_ln missing on a final-LN model, present on a model without one, wrong lengths: BadInput;
    naive/lp on a final-LN model: refused by generator and checker; a sequential MLP: refused."""
    model, certs = tiny_real
    cert = certs["any"]
    no_fl = copy.deepcopy(cert)
    del no_fl["evidence"]["final_ln"]
    assert "final_ln: required exactly when" in verdict(model, no_fl, "flint")
    short = copy.deepcopy(cert)
    short["evidence"]["final_ln"]["variance_direction"].pop()
    assert "variance_direction" in verdict(model, short, "flint")
    plain = model_of(*tiny_neox1l(14))
    pc, rep = generate_tight(plain, [1] * 20, 2, ("any", 2, None))
    assert pc is not None, rep
    pc["evidence"]["final_ln"] = cert["evidence"]["final_ln"]
    assert "final_ln: required exactly when" in verdict(plain, pc, "flint")
    with pytest.raises(BadInput, match="only by --method tight"):
        generate(model, [1] * 20, 2, ("any", 2, None), "naive", "table", "float")
    naive, _ = generate(plain, [1] * 20, 2, ("any", 2, None), "naive", "table", "float", force=True)
    assert "certified only by evidence method tight" in verdict(model, naive, "flint")
    t, c = tiny_neox_real(1)
    assert "sequential (GPT-2 style) MLP is not supported" in verdict(model_of(t, dict(c, parallel_attn_mlp=False)),
                                                                      cert, "flint")


def test_real_block_mutation_harness():
    """The mutation harness's real-block cases (tests/support/mutation.py real_block_cases): no mutant accepted
    and false, none internal, some rejected (flint sample and a smaller mpmath one)."""
    import tempfile
    import tcert.testing.mutation as M
    with tempfile.TemporaryDirectory() as d:
        cases = M.real_block_cases(d)
        shas = {cases[0].model_path: load_model(cases[0].model_path).sha256, str(SHIPPED_MODEL): load_model(str(SHIPPED_MODEL)).sha256}
        for i, case in enumerate(cases):
            for backend, n in (("flint", example_scale(40)), ("mpmath", example_scale(6))):
                tally = M.run_case(case, shas, n, seed=i, backend=backend)
                bad = [(cls, label, detail[:160]) for cls, label, detail, _ in tally.bad]
                assert not bad and tally.counts["accepted-false"] == 0, (case.name, bad[:5])
                assert tally.counts["rejected"] > 0


# ----------------------------------------------------------------------------- GPT-NeoX end to end

def hf_neox_checkpoint(folder, seed=0, vocab=10, hidden=16, heads=2, inter=32, rotary_pct=0.5, n_ctx=64):
    """Save a 1-layer GPT-NeoX (transformers) with deterministic random weights (numpy seed; every LN
    gain/bias and every linear bias nonzero) as a safetensors checkpoint folder; return the torch model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads,
                                     num_hidden_layers=1, intermediate_size=inter, rotary_pct=rotary_pct,
                                     max_position_embeddings=n_ctx, use_parallel_residual=True, hidden_act="gelu",
                                     tie_word_embeddings=False)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    r = np.random.default_rng(seed)
    state = {}
    for name, p in sorted(model.state_dict().items()):
        shape = tuple(p.shape)
        if name.endswith(("layernorm.weight", "final_layer_norm.weight")):
            a = 1 + r.normal(0, 0.2, shape)
        elif name.endswith(".bias"):
            a = r.normal(0, 0.2, shape)
        elif name.endswith(".weight"):
            a = r.normal(0, 0.5, shape)
        else:   # buffers
            state[name] = p
            continue
        state[name] = torch.tensor(np.asarray(a, np.float32))
    model.load_state_dict(state)
    with contextlib.redirect_stderr(io.StringIO()):
        model.save_pretrained(str(folder), safe_serialization=True)
    return model


def run_cli(main, argv):
    """(exit code, stdout) of a CLI main."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_gpt_neox_import_certify_check(tmp_path):
    """transformers GPT-NeoX (1 layer, parallel residual, separate LNs, final LN, GELU, biases, rotary_pct
    0.5) -> `tcert model import` -> `tcert overwhelm --method tight` -> `tcert-check` (both backends): VERIFIED,
    and true on every string of T by the oracle and by transformers itself."""
    torch = pytest.importorskip("torch")
    hf = hf_neox_checkpoint(tmp_path / "neox")
    path = str(tmp_path / "neox.safetensors")
    code, _ = run_cli(tcert_main, ["model", "import", str(tmp_path / "neox"), "--out", path])
    assert code == 0
    model = load_model(path)
    c = model.config
    assert (c.final_ln, c.shared_ln, c.parallel_attn_mlp, c.act_fn, c.rotary_dim, c.d_head) == (True, False, True, "gelu", 4, 8)
    # The shipped example is this import: the same tensors and config. Its file has no provenance metadata
    # (written before `tcert model import` recorded it), so the SHA-256 of the two files differ.
    shipped = load_model(str(SHIPPED_MODEL))
    assert shipped.config == c and shipped.tensors.keys() == model.tensors.keys()
    assert all(np.array_equal(shipped[k], model[k]) for k in model.tensors)
    assert json.loads(model.metadata["provenance"])["format"] == "checkpoint folder (Hugging Face model_type gpt_neox)"
    _, prefix, query, (kind, n_free, multiset) = SHIPPED[0]
    cert_path = str(tmp_path / "cert.json")
    code, out = run_cli(tcert_main, ["overwhelm", "--model", path, "--prefix-ids", ",".join(map(str, prefix)),
                                     "--query-id", str(query), "--free", "perm:" + ",".join(map(str, multiset)),
                                     "--method", "tight", "--out", cert_path])
    assert code == 0 and "Overwhelmed" in out and "final LN sigma" in out, out
    for backend in BACKENDS:
        code, out = run_cli(check_main, [cert_path, "--model", path, "--backend", backend])
        assert code == 0 and out.startswith("VERIFIED"), out
    k = json.load(open(cert_path))["claim"]["predicted"]
    ok, _ = exhaustive_confirms(model, prefix, query, kind, n_free, multiset, k)
    assert ok
    seqs = [list(prefix) + list(t) + [query] for t in free_strings(kind, n_free, multiset, c.d_vocab)]
    with torch.no_grad():
        ref = hf(torch.tensor(seqs)).logits[:, -1].double().numpy()
    assert (ref.argmax(axis=1) == k).all()
    code, out = run_cli(tcert_main, ["overwhelm", "--model", path, "--prefix-ids", "0,0", "--query-id", "1",
                                     "--free", "any:1", "--method", "naive", "--out", str(tmp_path / "n.json")])
    assert code == 2


def write_shipped(out_dir):
    """Regenerate the shipped example certificates from the shipped model (deterministic)."""
    model = load_model(str(SHIPPED_MODEL))
    for name, prefix, query, spec in SHIPPED:
        recorded = json.loads((CERTIFICATES / "overwhelm" / name).read_text())["generator"]["command"]
        with certificate.recording_command(recorded):       # the command line the shipped file records
            cert, rep = generate_tight(model, prefix, query, spec)
        assert cert is not None, rep
        certificate.write(os.path.join(out_dir, name), cert)


def test_shipped_real_block_certificates(tmp_path):
    """The shipped GPT-NeoX-shaped example: VERIFIED on both backends, regenerated byte-identically (up to another
    machine's BLAS last bits: tcert.testing.regeneration),
    and true on every string of T (110-bit oracle)."""
    write_shipped(str(tmp_path))
    model = load_model(str(SHIPPED_MODEL))
    for name, prefix, query, (kind, n_free, multiset) in SHIPPED:
        shipped = CERTIFICATES / "overwhelm" / name
        again, before = (tmp_path / name).read_bytes(), shipped.read_bytes()
        assert again == before or float_differences(json.loads(before), json.loads(again)) == [], name
        for backend in BACKENDS:
            ob = verify(str(shipped), str(SHIPPED_MODEL), backend)
            cert = ob.certificate
            assert "final LN sigma in" in ob.summary
        assert exhaustive_confirms(model, prefix, query, kind, n_free, multiset, cert["claim"]["predicted"])[0]


def test_upto_on_the_shipped_real_block():
    """--free upto:2 with method tight on the GPT-NeoX example: VERIFIED on both backends and true for every
    string of every length 0..2 (110-bit oracle); with method naive the generator refuses."""
    from tcert.generator.overwhelm.upto import generate_upto
    model = load_model(str(SHIPPED_MODEL))
    cert, rep = generate_upto(model, [0] * 12, 7, 2, "tight")
    assert cert is not None, rep
    for b in BACKENDS:
        assert verdict(model, cert, b) == "VERIFIED"
    k = cert["claim"]["predicted"]
    assert max(range(10), key=lambda j: Oracle(model).logits([0] * 12 + [7])[j]) == k
    for L in (1, 2):
        assert exhaustive_confirms(model, [0] * 12, 7, "any", L, None, k)[0]
    with pytest.raises(BadInput, match="only by --method tight"):
        generate_upto(model, [0] * 12, 7, 2, "naive")


if __name__ == "__main__":   # rewrite the shipped example: PYTHONPATH=. python tests/overwhelm/test_overwhelm_real_blocks.py
    import tempfile
    from tcert.generator.model.importers import import_gpt_neox
    from tcert.generator.model.files import save_model

    with tempfile.TemporaryDirectory() as d:
        hf_neox_checkpoint(os.path.join(d, "neox"))
        print(save_model(str(SHIPPED_MODEL), *import_gpt_neox(os.path.join(d, "neox"))))
    write_shipped(str(CERTIFICATES / "overwhelm"))
