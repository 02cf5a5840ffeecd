"""Small seeded models for the influence tests and benchmarks, and the shipped examples in
certificates/influence/."""

import numpy as np

from tcert.generator import certificate
from tcert.generator.influence.constants import influence_certificate
from tcert.generator.influence.corollary import corollary_certificate


def toy_model(n_layers=2, d_vocab=5, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=6, attention="causal",
              ln=True, attn_only=False, parallel=False, final_ln=True, act_fn="relu", rotary=False,
              eps="1/100", scale=0.5, seed=0, nope=False):
    """(tensors, config) of a small seeded random pre-LN model for tests and benchmarks.

    Weights are N(0, scale^2) (LN gains 1 + N(0, scale^2)). Independent of tcert.generator.model.random_models so that
    the influence tests keep their models fixed whatever that module's conventions become.
    """
    r = np.random.default_rng(seed)

    def g(*shape):
        return r.normal(0.0, scale, shape)

    t = {"embed.W_E": g(d_vocab, d_model), "unembed.W_U": g(d_model, d_vocab), "unembed.b_U": g(d_vocab)}
    if not (rotary or nope):   # nope: no positional embedding at all
        t["pos_embed.W_pos"] = g(n_ctx, d_model)
    for i in range(n_layers):
        p = f"blocks.{i}."
        for m in ("W_Q", "W_K", "W_V"):
            t[p + "attn." + m] = g(n_heads, d_model, d_head)
        for m in ("b_Q", "b_K", "b_V"):
            t[p + "attn." + m] = g(n_heads, d_head)
        t[p + "attn.W_O"], t[p + "attn.b_O"] = g(n_heads, d_head, d_model), g(d_model)
        if ln:
            t[p + "ln1.w"], t[p + "ln1.b"] = 1 + g(d_model), g(d_model)
            if not attn_only:
                t[p + "ln2.w"], t[p + "ln2.b"] = 1 + g(d_model), g(d_model)
        if not attn_only:
            t[p + "mlp.W_in"], t[p + "mlp.b_in"] = g(d_model, d_mlp), g(d_mlp)
            t[p + "mlp.W_out"], t[p + "mlp.b_out"] = g(d_mlp, d_model), g(d_model)
    final_ln = final_ln and ln
    if final_ln:
        t["ln_final.w"], t["ln_final.b"] = 1 + g(d_model), g(d_model)
    cfg = {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "d_head": d_head, "d_vocab": d_vocab,
           "n_ctx": n_ctx, "d_mlp": None if attn_only else d_mlp, "act_fn": act_fn,
           "normalization_type": "LN" if ln else None, "eps": eps, "final_ln": final_ln, "attn_only": attn_only,
           "attention_dir": attention, "parallel_attn_mlp": parallel,
           "positional_embedding_type": "rotary" if rotary else "none" if nope else "standard"}
    return t, cfg


def robust_toy_model(n_layers=2, d_vocab=8, d_model=16, n_ctx=64, attention="causal", seed=0):
    """(tensors, config) of an attention-only model whose answer is dominated by the last token's direct
    path (W_U = 3 W_E^T on orthogonal embeddings, small attention): the corollary holds with R >= 1 here."""
    t, cfg = toy_model(n_layers, d_vocab, d_model, 1, 4, None, n_ctx, attention, ln=False, attn_only=True,
                       scale=0.05, seed=seed)
    E = np.zeros((d_vocab, d_model))
    E[np.arange(d_vocab), np.arange(d_vocab)] = 3.0
    t["embed.W_E"] = E
    t["unembed.W_U"] = E.T.copy()
    t["unembed.b_U"] = np.zeros(d_vocab)
    return t, cfg


def write_examples(out_dir: str, anchor_npz: str) -> list:
    """(Re)write the shipped examples in certificates/influence/: the Max-of-4 anchor (causal, 1 layer),
    the robust 2-layer causal toy model with its corollary, and a 2-layer bidirectional pre-LN toy model.
    `python -c "from tcert.generator.influence import write_examples as w; w('certificates/influence',
    'certificates/anchors/maxofk/maxof4_seed123.npz')"`."""
    import os
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.importers import import_npz
    from tcert.generator.model.files import save_model
    written = []

    def model(name, tensors_cfg):
        path = os.path.join(out_dir, name + ".safetensors")
        save_model(path, *tensors_cfg)
        os.chmod(path, 0o644)
        return load_model(path)

    def cert(name, kind, c):
        path = os.path.join(out_dir, f"{name}.{kind}.json")
        certificate.write(path, c)
        written.append(path)

    m = model("maxof4_seed123", import_npz(anchor_npz, {"attention_dir": "causal"}))
    cert("maxof4_seed123", "influence", influence_certificate(m))
    m = model("robust2", robust_toy_model(2, n_ctx=64, attention="causal"))
    cert("robust2", "influence", influence_certificate(m))
    cert("robust2", "corollary", corollary_certificate(m, [1, 2, 3, 4, 5, 6, 7, 0] * 8)[0])
    m = model("toy2_bidir", toy_model(2, 6, 8, 2, 4, 16, 16, "bidirectional", scale=0.3, eps="1/10", seed=3))
    cert("toy2_bidir", "influence", influence_certificate(m))
    return written
