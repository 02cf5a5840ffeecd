"""Generate `influence` certificates (and the corollary on one input).

The float side computes the expensive matrix quantities with numpy (operator-norm trace-power bounds,
row-norm maxima of W_E, W_pos, W_U) and a centre hint for the embedding and unembedding; the scalar
recursion of docs/influence.md is then filled in by the checker's own `derive` run with a ledger that
*records* each constant (rounded up by a tiny relative slack) instead of checking it. So every
constant is as tight as the checker's recomputation allows, and any downward move of a constant by
more than the slack makes the checker reject.
"""

import math
from fractions import Fraction

import numpy as np

from tcert.checker.interval import make_backend
from tcert.checker.kinds import influence as kind
from tcert.checker.obligations import Obligations

from tcert.generator import certificate
from tcert.generator.prediction import prediction_claim

SLACK = Fraction(1, 2 ** 30)      # relative slack on every recorded constant (covers backend differences)
FLOAT_SLACK = 1e-9                # relative slack on numpy estimates of matrix quantities
DEFAULT_POWER = 6


def round_up(x: Fraction) -> Fraction:
    """The smallest double >= x * (1 + SLACK), as an exact Fraction."""
    x = Fraction(x) * (1 + SLACK)
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return Fraction(f)


class FillLedger:
    """Records constants instead of checking them: estimate (if given) or the rigorous bound, rounded up."""

    def __init__(self, estimates: dict):
        self.estimates, self.claimed, self.used = estimates, {}, set()

    def const(self, name, bound):
        """Record and return the constant `name`."""
        est = self.estimates.get(name)
        value = round_up(Fraction(est * (1 + FLOAT_SLACK)) if est is not None else bound())
        self.claimed[name] = value
        self.used.add(name)
        return value


def np_opnorm(factors, power: int) -> float:
    """Float version of `checker.kinds.influence.opnorm` (same trace-power bound), in log scale."""
    if len(factors) == 1:
        M = np.asarray(factors[0], np.float64)
        P = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    else:
        V, O = (np.asarray(f, np.float64) for f in factors)
        P = (V.T @ V) @ (O @ O.T)
    log_scale = 0.0
    for _ in range(power):
        s = np.abs(P).max()
        if s == 0:
            return 0.0
        P = P / s
        log_scale = 2 * (log_scale + math.log(s))
        P = P @ P
    tr = float(np.trace(P))
    if tr <= 0:
        return 0.0
    return math.exp((log_scale + math.log(tr)) / 2 ** (power + 1))


def np_max_row_dist(arr, center=None) -> float:
    """max_r ||arr[r] - center||_2 in float64."""
    a = np.asarray(arr, np.float64)
    if center is not None:
        a = a - np.asarray(center, np.float64)[None, :]
    return float(np.sqrt((a * a).sum(axis=1).max())) if a.size else 0.0


def estimates(model, n_max: int, power: int, embed_center, unembed_center) -> dict:
    """numpy estimates of every matrix-derived constant the checker will recompute."""
    cfg, t = model.config, model.tensors
    out = {"embed.token_norm": np_max_row_dist(t["embed.W_E"]),
           "D0": 2 * np_max_row_dist(t["embed.W_E"], embed_center),
           "unembed.radius": np_max_row_dist(np.asarray(t["unembed.W_U"]).T, unembed_center)}
    if cfg.positional_embedding_type == "standard":   # learned positions only (rotary and NoPE add none)
        out["embed.pos_norm"] = np_max_row_dist(t["pos_embed.W_pos"][:n_max])
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        for h in range(cfg.n_heads):
            q = f"L{layer}.h{h}."
            out[q + "W_Q"] = np_opnorm([t[p + "attn.W_Q"][h]], power)
            out[q + "W_K"] = np_opnorm([t[p + "attn.W_K"][h]], power)
            out[q + "OV"] = np_opnorm([t[p + "attn.W_V"][h], t[p + "attn.W_O"][h]], power)
            if not cfg.rotary:
                out[q + "QK"] = np_opnorm([t[p + "attn.W_Q"][h], np.asarray(t[p + "attn.W_K"][h]).T], power)
        if not cfg.attn_only:
            out[f"L{layer}.mlp.W_in"] = np_opnorm([t[p + "mlp.W_in"]], power)
            out[f"L{layer}.mlp.W_out"] = np_opnorm([t[p + "mlp.W_out"]], power)
    return out


def centre(rows) -> np.ndarray:
    """A centre hint for a point set: the midpoint of its bounding box, refined by a few
    Badoiu-Clarkson steps towards the minimum enclosing ball (any centre is valid)."""
    a = np.asarray(rows, np.float64)
    c = (a.max(axis=0) + a.min(axis=0)) / 2
    for k in range(1, 40):
        far = a[np.argmax(((a - c) ** 2).sum(axis=1))]
        c = c + (far - c) / (k + 1)
    return c.astype(np.float32).astype(np.float64)  # short exact hex strings


def default_rate(cfg) -> str:
    """The rate this family certifies for the model's mask."""
    return "harmonic" if cfg.attention == "causal" and cfg.n_layers > 1 else "inverse"


def influence_parts(model, n_min: int = 2, n_max: int | None = None, power: int = DEFAULT_POWER,
                    backend: str = "flint"):
    """(claim, evidence, ledger) of an influence certificate for `model`."""
    cfg, t = model.config, model.tensors
    n_max = cfg.n_ctx if n_max is None else n_max
    if not 2 <= n_min <= n_max <= cfg.n_ctx:
        from tcert.checker.errors import BadInput
        raise BadInput(f"need 2 <= n_min <= n_max <= n_ctx = {cfg.n_ctx}")
    ec = centre(t["embed.W_E"])
    uc = centre(np.asarray(t["unembed.W_U"]).T)
    ld = FillLedger(estimates(model, n_max, power, ec, uc))
    need = kind.derive(model, make_backend(backend), ld, n_max, power, [Fraction(float(x)) for x in ec],
                       [Fraction(float(x)) for x in uc], Obligations())
    claim = {"n_min": n_min, "n_max": n_max, "rate": default_rate(cfg)}
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):   # C and C_abs are recorded constants already
        claim[key] = certificate.num(float(need[key] if key in ("C", "C_abs") else round_up(need[key])))
    evidence = {"power": power, "embed_center": [certificate.num(float(x)) for x in ec],
                "unembed_center": [certificate.num(float(x)) for x in uc],
                "constants": {k: certificate.num(float(v)) for k, v in ld.claimed.items()}}  # doubles: exact hex
    return claim, evidence, need


def influence_certificate(model, n_min: int = 2, n_max: int | None = None, power: int = DEFAULT_POWER):
    """A full influence certificate (envelope included)."""
    claim, evidence, _ = influence_parts(model, n_min, n_max, power)
    return certificate.envelope("influence", model, claim, evidence)


def gap_lipschitz(model, k: int) -> Fraction:
    """Rounded-up numpy estimate of max_j ||W_U[:,k] - W_U[:,j]||_2."""
    W = np.asarray(model.tensors["unembed.W_U"], np.float64)
    return round_up(Fraction(np_max_row_dist(W.T, W[:, k]) * (1 + FLOAT_SLACK)))


def corollary_certificate(model, tokens, substitutions: int | None = None, n_min: int = 2,
                          n_max: int | None = None, power: int = DEFAULT_POWER):
    """(certificate or None, info): influence certificate whose claim adds the robustness corollary.

    substitutions None: the largest R the bounds allow. Returns None when the prediction is a near-tie
    or the requested R is not certifiable (info says why and what the largest certifiable R is).
    """
    n = len(tokens)
    n_max = model.config.n_ctx if n_max is None else n_max
    n_min = min(n_min, n)
    claim, evidence, aux = influence_parts(model, n_min, n_max, power)
    pclaim, p = prediction_claim(model, tokens)
    info = {"n": n, "predicted": p["predicted"], "gap": p["gap"]}
    if pclaim is None:
        return None, dict(info, reason="near-tie")
    G = gap_lipschitz(model, p["predicted"])
    margin = Fraction(float.fromhex(pclaim["margin"]))
    per_change = G * aux["lam_f"] * min(aux["C"] * kind.rate(claim["rate"], n, model.config.n_layers), aux["C_abs"])
    best = 0
    while best + 1 <= n - 1 and (best + 1) * per_change < margin:
        best += 1
    info.update(per_change=float(per_change), margin=float(margin), max_R=best)
    R = best if substitutions is None else substitutions
    if R < 1 or R > best:
        why = (f"one substitution may move the logit gap by up to {float(per_change):.4g} >= margin {float(margin):.4g}"
               if best == 0 else f"R = {R} is not certifiable; the largest certifiable R is {best}")
        return None, dict(info, reason=why)
    claim["corollary"] = {"prediction": pclaim, "substitutions": R, "gap_lipschitz": certificate.num(float(G))}
    info["R"] = R
    return certificate.envelope("influence", model, claim, evidence), info


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
           "attention": attention, "parallel_attn_mlp": parallel,
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


def adversarial_influence(model, n: int, trials: int = 64, greedy_rounds: int = 2, seed: int = 0):
    """Largest (||y - y'||_2, ||p - p'||_1) found over pairs of length-n inputs differing at one position
    i < n-1: random base inputs, then greedy coordinate ascent on the base and the substituted token
    (float64 forward pass; a lower bound on the true worst case, for tightness reports and tests)."""
    from tcert.generator.model.forward import logits, residuals
    cfg = model.config
    rng = np.random.default_rng(seed)
    V = cfg.d_vocab

    # Pairwise differences cost (replacements)^2 * d memory: past 256 tokens, search over a random
    # subset of replacements (still a lower bound on the worst case, which is all a search gives).
    replacements = np.arange(V) if V <= 256 else np.sort(rng.choice(V, size=256, replace=False))

    def measure(base, i):
        """Both quantities, worst over the replacement tokens at position i."""
        batch = np.repeat(base[None], len(replacements), axis=0)
        batch[:, i] = replacements
        y = residuals(model, batch)[-1][:, -1]
        lg = logits(model, batch)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dy = np.sqrt(((y[:, None] - y[None]) ** 2).sum(-1)).max()
        dp = np.abs(p[:, None] - p[None]).sum(-1).max()
        return float(dy), float(dp)

    best_y = best_p = 0.0
    for _ in range(trials):
        base = rng.integers(0, V, n)
        i = int(rng.integers(0, n - 1))
        cur = measure(base, i)
        for _ in range(greedy_rounds):
            others = [pos for pos in range(n) if pos != i]
            for pos in rng.choice(others, size=min(len(others), 8), replace=False):
                cands = rng.choice(V, size=min(V, 6), replace=False)
                for tok in cands:
                    trial = base.copy()
                    trial[pos] = tok
                    val = measure(trial, i)
                    if val[0] > cur[0]:
                        base, cur = trial, val
        best_y, best_p = max(best_y, cur[0]), max(best_p, cur[1])
    return best_y, best_p


def write_examples(out_dir: str, anchor_npz: str) -> list:
    """(Re)write the shipped examples in certificates/influence/: the Max-of-4 anchor (causal, 1 layer),
    the robust 2-layer causal toy model with its corollary, and a 2-layer bidirectional pre-LN toy model.
    `python -c "from generator.influence import write_examples as w; w('certificates/influence',
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

    m = model("maxof4_seed123", import_npz(anchor_npz, {"attention": "causal"}))
    cert("maxof4_seed123", "influence", influence_certificate(m))
    m = model("robust2", robust_toy_model(2, n_ctx=64, attention="causal"))
    cert("robust2", "influence", influence_certificate(m))
    cert("robust2", "corollary", corollary_certificate(m, [1, 2, 3, 4, 5, 6, 7, 0] * 8)[0])
    m = model("toy2_bidir", toy_model(2, 6, 8, 2, 4, 16, 16, "bidirectional", scale=0.3, eps="1/10", seed=3))
    cert("toy2_bidir", "influence", influence_certificate(m))
    return written
