"""Models without positional information (positional_embedding_type "none", overwhelm paper appendix F).

- the model format: "none" loads without a `pos_embed.W_pos` and refuses one;
- semantics, checked against an independent 110-bit oracle (the overwhelm oracle with the rotation
  taken out): the checker's enclosures contain the oracle's logits, and the last position's logits do
  not depend on the order of the earlier tokens nor, for a repeated token, on the length (Lemma F.3);
- soundness: naive, lp and tight overwhelm certificates on random tiny NoPE models, checked by both
  backends; whatever is VERIFIED is confirmed on every free string by the oracle;
- `tcert train text --no-rope` and the shipped model `certificates/models/text_nope.safetensors`.
"""

import dataclasses
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcert.testing.overwhelm as overwhelm_helpers
from tcert.checker.errors import BadInput
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES, example_scale
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.model.files import save_model
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tight import generate_tight
from tcert.testing.overwhelm import Oracle, exhaustive_confirms, model_of, verdict
from tcert.testing.overwhelm import tiny_nope

NOPE = CERTIFICATES / "models" / "text_nope.safetensors"


class NopeOracle(Oracle):
    """The overwhelm tests' 110-bit oracle for a model without positions: the rotation is the identity.

    The base class reads rotary parameters from the config, so it is built on a rotary twin of the
    config (same everything else) and `rot` is overridden."""

    def __init__(self, model, prec=110):
        assert model.config.positional_embedding_type == "none"
        twin = dataclasses.replace(model.config, positional_embedding_type="rotary", rotary_dim=2)
        super().__init__(dataclasses.replace(model, config=twin), prec)

    def rot(self, v, pos):
        return list(v)


def as_fraction(x):
    """An mpf as an exact Fraction (sign * man * 2^exp)."""
    man, exp = int(x.man) * (-1 if x < 0 else 1), int(x.exp)
    return Fraction(man) * Fraction(2) ** exp


def test_model_file_none_has_no_position_table(tmp_path):
    tensors, cfg = tiny_nope(seed=1)
    save_model(str(tmp_path / "m.safetensors"), tensors, cfg)
    m = load_model(str(tmp_path / "m.safetensors"))
    assert m.config.positional_embedding_type == "none" and not m.config.rotary
    with pytest.raises(BadInput):
        save_model(str(tmp_path / "bad.safetensors"),
                   dict(tensors, **{"pos_embed.W_pos": np.zeros((cfg["n_ctx"], cfg["d_model"]), np.float32)}), cfg)
        load_model(str(tmp_path / "bad.safetensors"))
    with pytest.raises(BadInput):
        model_of(tensors, dict(cfg, positional_embedding_type="nope"))


@pytest.mark.parametrize("seed", [3, 4])
def test_enclosures_contain_oracle_and_order_does_not_matter(seed):
    """Checker enclosures (both backends) contain the oracle's logits; permuting the earlier tokens, or
    repeating a token any number of times, leaves the last position's logits unchanged."""
    model = model_of(*tiny_nope(seed=seed, d_vocab=5))
    orc = NopeOracle(model)
    rng = np.random.default_rng(seed)
    seq = [int(x) for x in rng.integers(0, 5, 7)]
    perm = [int(x) for x in rng.permutation(seq[:-1])] + seq[-1:]
    ref = orc.logits(seq)
    assert max(abs(a - b) for a, b in zip(ref, orc.logits(perm))) < 1e-25
    assert np.allclose(float_logits(model, np.asarray([seq, perm]))[0], float_logits(model, np.asarray([perm]))[0],
                       rtol=0, atol=1e-12)
    for backend in ("flint", "mpmath"):
        B = make_backend(backend)
        for toks in (seq, perm):
            for enc, x in zip(last_logits(B, model, toks), ref):
                # the oracle is within 2^-100 relative of the exact logit the enclosure contains
                x = as_fraction(x)
                slack = (abs(x) + 1) / 2 ** 100
                assert B.lower(enc) - slack <= x <= B.upper(enc) + slack
    reps = [orc.logits([2] * n) for n in (1, 2, 9)]
    for r in reps[1:]:
        assert max(abs(a - b) for a, b in zip(r, reps[0])) < 1e-25


@st.composite
def scenarios(draw):
    """A random tiny NoPE model and an overwhelm question; prefixes biased towards a repeated token."""
    d_vocab = draw(st.integers(3, 6))
    model_args = dict(seed=draw(st.integers(0, 10 ** 6)), d_vocab=d_vocab, n_heads=draw(st.integers(1, 3)),
                      d_head=draw(st.sampled_from([2, 4])), qk_scale=draw(st.sampled_from([0.2, 0.5, 1.0])),
                      near_tie=draw(st.integers(0, 9)) == 0, attn_scale=draw(st.sampled_from([None, "3/2"])))
    n_fix = draw(st.sampled_from([0, 1, 4, 12, 30]))
    dominant = draw(st.integers(0, d_vocab - 1))
    noise = draw(st.lists(st.integers(0, d_vocab - 1), min_size=n_fix, max_size=n_fix))
    mix = draw(st.sampled_from([0, 0, 0.5]))   # 0: the repetition restriction (appendix F)
    prefix = [noise[i] if i < int(mix * n_fix) else dominant for i in range(n_fix)]
    query = dominant if mix == 0 and draw(st.booleans()) else draw(st.integers(0, d_vocab - 1))
    n_free = draw(st.integers(1, 3 if d_vocab <= 4 else 2))
    kind = draw(st.sampled_from(["any", "perm"]))
    multiset = draw(st.lists(st.integers(0, d_vocab - 1), min_size=n_free, max_size=n_free)) if kind == "perm" else None
    return dict(model_args=model_args, prefix=prefix, query=query, spec=(kind, n_free, multiset),
                method=draw(st.sampled_from(["naive", "lp", "tight"])))


def test_nope_certificates_are_true(monkeypatch):
    """Every certificate on a NoPE model gets the same verdict from both backends; VERIFIED ones hold on
    every free string (exhaustive NoPE oracle)."""
    monkeypatch.setattr(overwhelm_helpers, "Oracle", NopeOracle)
    stats = Counter()

    @settings(max_examples=example_scale(120), deadline=None)
    @given(scenarios())
    def prop(s):
        model = model_of(*tiny_nope(**s["model_args"]))
        if s["method"] == "tight":
            cert, _ = generate_tight(model, s["prefix"], s["query"], s["spec"])
        else:
            cert, _ = generate(model, s["prefix"], s["query"], s["spec"], s["method"], "table", "tight")
        stats["examples"] += 1
        if cert is None:
            return
        verdicts = {b: verdict(model, cert, b) for b in ("flint", "mpmath")}
        assert verdicts["flint"] == verdicts["mpmath"], verdicts
        if verdicts["flint"] != "VERIFIED":
            stats["rejected"] += 1
            return
        stats[f"verified {cert['evidence']['method']}"] += 1
        kind, n_free, multiset = s["spec"]
        ok, gap = exhaustive_confirms(model, s["prefix"], s["query"], kind, n_free, multiset,
                                      cert["claim"]["predicted"])
        assert ok, f"VERIFIED NoPE certificate contradicted by exhaustive evaluation (gap {gap}): {cert['claim']}"

    prop()
    print("NoPE overwhelm soundness:", dict(stats))
    for method in ("naive", "tight"):
        assert stats[f"verified {method}"] > 0, dict(stats)
    assert stats["verified lp"] + stats["verified naive"] + stats["verified tight"] >= 0.2 * stats["examples"]


def test_repetition_restriction_w_falls_and_ptp_is_constant():
    """Appendix F on a tiny NoPE model: with s = r^n and q = r, PTP at t = r^n_free does not depend on n
    (Lemma F.3) and W (naive) decreases with n, reaching W < PTP/2 (convergence to a fixed model)."""
    model = model_of(*tiny_nope(seed=11, d_vocab=5, qk_scale=0.3, n_ctx=2048))
    rows = []
    for n in (1, 4, 16, 64, 256, 1024):
        _, r = generate(model, [0] * n, 0, ("any", 2, None), "naive", "table", "float", force=True)
        rows.append((r["deviation"], r["ptp_float"]))
    ptps = [p for _, p in rows]
    assert max(ptps) - min(ptps) < 1e-9 * (1 + max(ptps))
    ws = [w for w, _ in rows]
    assert all(b < a for a, b in zip(ws, ws[1:]))
    assert ws[-1] < ptps[-1] / 2 < ws[0]


def test_train_text_no_rope_writes_a_position_free_model(tmp_path):
    """`tcert train text --no-rope` (train_text(rope=False)): config type "none", no W_pos, the torch
    training forward equals the numpy forward on the saved file, training lowers the held-out loss."""
    torch = pytest.importorskip("torch")
    from tcert.generator.train.text import forward, train_text
    path = tmp_path / "m.safetensors"
    cfg, history, held = train_text(str(path), d_model=16, d_mlp=32, n_heads=2, vocab="small", vocab_size=300,
                                    steps=30, seq_len=16, batch=8, lr=1e-2, seed=3, n_ctx=64, eval_every=30,
                                    eval_windows=8, sources="lee", progress=False, rope=False)
    assert cfg["positional_embedding_type"] == "none" and cfg["rotary_dim"] is None
    m = load_model(str(path))
    assert "pos_embed.W_pos" not in m.tensors and not m.config.rotary
    assert held < history[0][2] - 0.3, history
    x = np.random.default_rng(0).integers(0, m.config.d_vocab, (2, 20))
    p = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in m.tensors.items()}
    expected = forward(torch, p, cfg, torch.tensor(x)).numpy()[:, -1]
    assert np.allclose(float_logits(m, x), expected, rtol=1e-10, atol=1e-10)


def test_shipped_nope_model_is_position_free():
    """The shipped appendix-F model has no positional information: permuting the tokens before the last
    one does not change the last position's logits."""
    m = load_model(str(NOPE))
    assert m.config.positional_embedding_type == "none" and "pos_embed.W_pos" not in m.tensors
    rng = np.random.default_rng(5)
    seq = [int(t) for t in rng.integers(0, m.config.d_vocab, 40)]
    batch = [seq] + [[int(t) for t in rng.permutation(seq[:-1])] + seq[-1:] for _ in range(3)]
    out = float_logits(m, np.asarray(batch))
    assert np.allclose(out, out[0], rtol=0, atol=1e-9)
