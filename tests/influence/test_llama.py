"""Influence constants for the Llama-family pieces (RMSNorm, SiLU-gated MLP, grouped-query attention, linear
RoPE scaling): exhaustive rigorous oracle on tiny models, mutation of every new constant, both backends, and
a tiny LlamaForCausalLM built with transformers, imported and certified."""

import copy
import itertools
from fractions import Fraction

import pytest

from tcert.checker.errors import Rejected
from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.rates import rate
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify
from tcert.generator import certificate
from tcert.generator.influence import influence_certificate
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model

LLAMAS = {
    "L1-gqa-rope-scaled": dict(n_layers=1, n_key_value_heads=1, rotary_scaling_factor="2"),
    "L2-gqa": dict(n_layers=2, n_key_value_heads=1),
    "L2-mha-gelu-gated": dict(n_layers=2, act_fn="gelu"),
}


def tiny_llama(tmp_path, seed=1, **kw):
    """A random Llama-family model (RMSNorm, gated MLP with b_in, rotary) with d_vocab 3, n_ctx 4."""
    t, cfg = random_model("llama", seed=seed, **{"d_vocab": 3, "d_model": 8, "n_heads": 2, "d_head": 4, "d_mlp": 8,
                                                "n_ctx": 4, "bias_std": 0.3, "eps": "1/10", **kw})
    path = str(tmp_path / "llama.safetensors")
    save_model(path, t, cfg)
    return path, load_model(path)


@pytest.mark.parametrize("name", sorted(LLAMAS))
def test_exhaustive_llama_soundness(tmp_path, name):
    """Every single non-final change of every input of every length n in [2, 4], evaluated rigorously (Arb,
    100 bits): ||y - y'|| and ||p - p'||_1 stay within the certified bounds, which the checker verifies."""
    path, model = tiny_llama(tmp_path, **LLAMAS[name])
    assert {"RMSNorm", "gated MLP"} <= set(model.config.llama_pieces())
    cert = influence_certificate(model)
    verify(cert, path)
    c = {k: parse_number(cert["claim"][k], k) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    B, worst = make_backend("flint", 100), Fraction(0)
    W = Weights(B, model)
    for n in range(2, 5):
        r = rate(cert["claim"]["rate"], n, model.config.n_layers)
        bound_y, bound_p = min(c["C"] * r, c["C_abs"]), min(c["C_prob"] * r, c["C_prob_abs"])
        outs = {x: (final_residual(B, model, list(x), W), softmax(B, last_logits(B, model, list(x), W)))
                for x in itertools.product(range(3), repeat=n)}
        for x, (y, p) in outs.items():
            for i in range(n - 1):
                for tok in range(x[i] + 1, 3):
                    y2, p2 = outs[x[:i] + (tok,) + x[i + 1:]]
                    dy = B.upper(B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2))))
                    assert dy <= bound_y and sum(B.abs_upper(a - b) for a, b in zip(p, p2)) <= bound_p, (n, x, i, tok)
                    worst = max(worst, dy / bound_y)
    assert 0 < worst <= 1


def test_llama_backends_agree_and_every_constant_mutated_down_rejected(tmp_path):
    """Both backends verify with the same recomputed needs (1e-12 relative); every constant (the gated MLP's
    W_gate, gate_max, in_max, radius, lip among them) lowered by 2^-20 relative is REJECTED under its name."""
    path, model = tiny_llama(tmp_path, **LLAMAS["L2-gqa"])
    cert = influence_certificate(model)
    figs = [verify(cert, path, b) for b in ("flint", "mpmath")]
    for key in ("claim.C", "claim.C_abs", "claim.C_prob"):
        a, b = (ob.figure(key) for ob in figs)
        assert abs(a - b) <= Fraction(1, 10 ** 12) * max(a, b)
    names = sorted(cert["evidence"]["constants"])
    assert {"L0.mlp.W_gate", "L0.mlp.gate_max", "L0.mlp.in_max", "L1.mlp.lip"} <= set(names)
    shrink = 1 - Fraction(1, 2 ** 20)
    for name in names:
        bad = copy.deepcopy(cert)
        bad["evidence"]["constants"][name] = certificate.num(parse_number(bad["evidence"]["constants"][name], name) * shrink)
        with pytest.raises(Rejected, match=name.replace(".", r"\.")):
            verify(bad, path)


@pytest.mark.torch
def test_transformers_llama_imported_and_certified(tmp_path):
    """A tiny LlamaForCausalLM (grouped-query attention, RMSNorm, SwiGLU, linear RoPE scaling) built with
    transformers, saved, imported: its influence certificate verifies with both backends, and an
    adversarial search stays below it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tcert.generator.influence import adversarial_influence
    from tcert.generator.cli import main
    cfg = transformers.LlamaConfig(vocab_size=16, max_position_embeddings=8, hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
                                   rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    path = str(tmp_path / "llama.safetensors")
    assert main(["model", "import", str(tmp_path / "hf"), "--out", path]) == 0
    model = load_model(path)
    assert model.config.n_key_value_heads == 2 and model.config.rotary_scaling_factor == 2
    cert = influence_certificate(model)
    for backend in ("flint", "mpmath"):
        assert "one changed non-final token" in verify(cert, path, backend).summary
    c = {k: parse_number(cert["claim"][k], k) for k in ("C", "C_abs")}
    for n in (2, 8):
        dy, _ = adversarial_influence(model, n, trials=4, greedy_rounds=1, seed=n)
        assert 0 < dy <= min(c["C"] * rate(cert["claim"]["rate"], n, 2), c["C_abs"])
