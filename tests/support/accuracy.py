"""Max-of-K models and oracles shared by the accuracy tests: hand-built models, exhaustive float gaps,
cases and the exact-rational EQKE."""

from fractions import Fraction
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.kinds.accuracy.tables import integer_tables
from tcert.checker.modelfile import load_model
from tcert.generator.model.files import save_model
import hashlib
import itertools
import json
import numpy as np


def constructed(v: int, k: int, sharp: float, gain: float, noise: float, seed: int):
    """A hand-built Max-of-k model plus Gaussian noise (on every weight and bias): attention score
    sharp * t / (v - 1) on key token t (a size direction read by a constant query direction), values
    copied to a separate logit subspace with `gain`; the direct path reads nothing. noise = 0 is a
    near-perfect model."""
    d = 2 * v + 2
    E = np.zeros((v, d))
    E[np.arange(v), np.arange(v)] = 1
    E[:, v] = np.arange(v) / (v - 1)
    P = np.zeros((k, d))
    P[:, v + 1] = 1
    WQ, WK, WO, WU = np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, v))
    WQ[v + 1, 0] = sharp
    WK[v, 0] = 1
    WO[np.arange(v), v + 2 + np.arange(v)] = 1
    WU[v + 2 + np.arange(v), np.arange(v)] = gain
    rng = np.random.default_rng(seed)
    t = {"embed.W_E": E, "pos_embed.W_pos": P, "blocks.0.attn.W_Q": WQ[None], "blocks.0.attn.W_K": WK[None],
         "blocks.0.attn.W_V": np.eye(d)[None], "blocks.0.attn.W_O": WO[None], "unembed.W_U": WU}
    t = {n: (a + noise * rng.standard_normal(a.shape)).astype(np.float32) for n, a in t.items()}
    shapes = {"blocks.0.attn.b_Q": (1, d), "blocks.0.attn.b_K": (1, d), "blocks.0.attn.b_V": (1, d),
              "blocks.0.attn.b_O": (d,), "unembed.b_U": (v,)}
    t.update({n: (noise * rng.standard_normal(shape)).astype(np.float32) for n, shape in shapes.items()})
    config = dict(n_layers=1, d_model=d, n_heads=1, d_head=d, d_vocab=v, n_ctx=k, attn_only=True,
                  normalization_type=None)
    return t, config


def maxofk_model(v: int, k: int, seed: int, noise: float, sharp: float):
    """A hand-built Max-of-k model (attention to the largest key token, values copied to the logits)
    plus Gaussian noise on every tensor, so that some inputs are answered wrongly."""
    rng = np.random.default_rng(seed)
    d = 2 * v + 2
    E = np.zeros((v, d))
    E[np.arange(v), np.arange(v)] = 1
    E[:, v] = np.arange(v) / (v - 1)
    P = np.zeros((k, d))
    P[:, v + 1] = 1
    WQ, WK, WO, WU = np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, v))
    WQ[v + 1, 0], WK[v, 0] = sharp, 1
    WO[np.arange(v), v + 2 + np.arange(v)] = 1
    WU[v + 2 + np.arange(v), np.arange(v)] = 3
    t = {"embed.W_E": E, "pos_embed.W_pos": P, "blocks.0.attn.W_Q": WQ[None], "blocks.0.attn.W_K": WK[None],
         "blocks.0.attn.W_V": np.eye(d)[None], "blocks.0.attn.W_O": WO[None], "unembed.W_U": WU,
         "blocks.0.attn.b_Q": np.zeros((1, d)), "blocks.0.attn.b_K": np.zeros((1, d)),
         "blocks.0.attn.b_V": np.zeros((1, d)), "blocks.0.attn.b_O": np.zeros(d), "unembed.b_U": np.zeros(v)}
    t = {n: (a + noise * rng.standard_normal(a.shape)).astype(np.float32) for n, a in t.items()}
    config = dict(n_layers=1, d_model=d, n_heads=1, d_head=d, d_vocab=v, n_ctx=k, attn_only=True,
                  normalization_type=None)
    return t, config


def float_gaps(model):
    """Float64 last-position gap logit[max] - max_{x != max} logit[x] for every input (own numpy forward)."""
    c, t = model.config, {n: np.asarray(a, dtype=np.float64) for n, a in model.tensors.items()}
    toks = np.array(list(itertools.product(range(c.d_vocab), repeat=c.n_ctx)))
    x = t["embed.W_E"][toks] + t["pos_embed.W_pos"][None]
    q = x[:, -1] @ t["blocks.0.attn.W_Q"][0] + t["blocks.0.attn.b_Q"][0]
    key = x @ t["blocks.0.attn.W_K"][0] + t["blocks.0.attn.b_K"][0]
    s = np.einsum("bd,bnd->bn", q, key) / np.sqrt(c.d_head)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    val = x @ t["blocks.0.attn.W_V"][0] + t["blocks.0.attn.b_V"][0]
    z = np.einsum("bn,bnd->bd", a, val) @ t["blocks.0.attn.W_O"][0] + t["blocks.0.attn.b_O"]
    lg = (x[:, -1] + z) @ t["unembed.W_U"] + t["unembed.b_U"]
    mx = toks.max(axis=1)
    right = lg[np.arange(len(toks)), mx].copy()
    lg[np.arange(len(toks)), mx] = -np.inf
    return toks, right - lg.max(axis=1)


def certainly_wrong(model, toks, gaps) -> set:
    """Inputs whose max token is certainly not strictly ahead: float gap < -1e-6, or near a tie and the
    rigorous forward pass shows logit[max] <= logit[x] for some x."""
    wrong = {tuple(int(v) for v in tk) for tk, g in zip(toks, gaps) if g < -1e-6}
    B = make_backend("flint")
    for tk, g in zip(toks, gaps):
        if abs(g) <= 1e-6:
            L, m = last_logits(B, model, [int(v) for v in tk]), int(max(tk))
            if any(B.upper(L[m] - L[x]) <= 0 for x in range(len(L)) if x != m):
                wrong.add(tuple(int(v) for v in tk))
    return wrong


def case_of(tk):
    """(m, q, c, non-max tokens at non-query positions) of one input."""
    m, q = max(tk), tk[-1]
    others = [t for t in tk[:-1] if t != m]
    return m, q, len(others), set(others)


def all_cases(n, v):
    for m in range(v):
        for q in range(m + 1):
            for c in range(0, (n - 1 if q == m else n - 2) + 1):
                yield m, q, c


def maxofk_instance(tmp_path_factory, v, k, seed, noise, sharp):
    """(model, every input, the inputs it certainly answers wrongly) of one maxofk_model."""
    path = str(tmp_path_factory.mktemp("redteam_acc") / "m.safetensors")
    save_model(path, *maxofk_model(v, k, seed, noise, sharp))
    model = load_model(path)
    toks, gaps = float_gaps(model)
    return model, [tuple(int(v) for v in tk) for tk in toks], certainly_wrong(model, toks, gaps)


def rational_eqke(tmp_path):
    """(model, flint value tables, EQKE in exact rationals up to a per-query constant) of a noisy Max-of-3
    model with attn_scale 2 (so EQKE is rational)."""
    v, k = 5, 3
    t, config = maxofk_model(v, k, 21, 0.2, 10.0)
    config["attn_scale"] = "2"
    path = str(tmp_path / "m.safetensors")
    save_model(path, t, config)
    model = load_model(path)
    T = integer_tables(make_backend("flint"), model, True)
    fr = {name: [[Fraction(float(x)) for x in np.atleast_1d(row)] for row in np.atleast_2d(a)]
          for name, a in model.tensors.items() if a.ndim <= 2}
    Wq = [[Fraction(float(x)) for x in row] for row in model.tensors["blocks.0.attn.W_Q"][0]]
    Wk = [[Fraction(float(x)) for x in row] for row in model.tensors["blocks.0.attn.W_K"][0]]
    bq = [Fraction(float(x)) for x in model.tensors["blocks.0.attn.b_Q"][0]]
    E, P = fr["embed.W_E"], fr["pos_embed.W_pos"]
    d = len(E[0])
    X = [[E[a][i] + P[k - 1][i] for i in range(d)] for a in range(v)]
    Q = [[sum(X[a][i] * Wq[i][h] for i in range(d)) + bq[h] for h in range(d)] for a in range(v)]
    K = [[sum(E[a][i] * Wk[i][h] for i in range(d)) for h in range(d)] for a in range(v)]
    return model, T, [[sum(Q[a][h] * K[b][h] for h in range(d)) / 2 for b in range(v)] for a in range(v)]


def assert_split_brackets(S, EQKE, name=""):
    """(ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k']
    + eps[q]) 2^-shift for all q, k, k'."""
    one, v = Fraction(1, 1 << S["shift"]), len(EQKE)
    for q in range(v):
        for a in range(v):
            for b in range(v):
                diff = EQKE[q][a] - EQKE[q][b]
                assert (S["ab_lo"][q, a] - S["ab_hi"][q, b] - S["eps"][q]) * one <= diff, name
                assert diff <= (S["ab_hi"][q, a] - S["ab_lo"][q, b] + S["eps"][q]) * one, name


def nope_maxofk(tmp_path):
    t, cfg = maxofk_model(4, 3, 0, 0.05, 15.0)
    t.pop("pos_embed.W_pos")
    cfg["positional_embedding_type"] = "none"
    path = str(tmp_path / "acc_nope.safetensors")
    save_model(path, t, cfg)
    return path


def write_certificate(tmp_path, name, kind, model_path, claim, evidence):
    cert = {"format": "tcert-certificate", "version": 1, "kind": kind,
            "model_sha256": hashlib.sha256(open(model_path, "rb").read()).hexdigest(),
            "claim": claim, "evidence": evidence}
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump(cert, f)
    return path


def input_verdicts(model) -> dict:
    """Every input of a Max-of-K model -> True (certainly correct), False (certainly not: a tie or worse) or
    None (not decided at 120 bits): float64 decides gaps beyond 1e-6, the rigorous forward pass the rest."""
    toks, gaps = float_gaps(model)
    B = make_backend("flint", 120)
    out = {}
    with B.precision():
        for tk, g in zip(toks, gaps):
            key = tuple(int(t) for t in tk)
            if abs(g) > 1e-6:
                out[key] = bool(g > 0)
                continue
            L, m = last_logits(B, model, list(key)), max(key)
            diffs = [L[m] - L[x] for x in range(len(L)) if x != m]
            out[key] = True if all(B.lower(d) > 0 for d in diffs) else \
                False if any(B.upper(d) <= 0 for d in diffs) else None
    return out


def random_distribution(rng, n: int, v: int, max_at_least: bool = True, weights: bool = True) -> dict:
    """claim.distribution's JSON form with random exact weights (some zero) and/or a random max_at_least."""
    dist = {}
    if weights:
        dist["position_weights"] = [[str(Fraction(rng.randint(0, 5), rng.choice((1, 2, 3, 7)))) for _ in range(v)]
                                    for _ in range(n)]
    if max_at_least:
        dist["max_at_least"] = rng.randint(0, v - 1)
    return dist


def input_weight(dist: dict, tokens) -> Fraction:
    """The weight an input has under claim.distribution's JSON form (direct product; the oracle)."""
    if max(tokens) < dist.get("max_at_least", 0):
        return Fraction(0)
    w = Fraction(1)
    for i, t in enumerate(tokens):
        if "position_weights" in dist:
            w *= Fraction(dist["position_weights"][i][t])
    return w


def weighted_truth(verdicts: dict, dist: dict) -> tuple:
    """(weight of the inputs certainly correct, weight of those not certainly wrong) under `dist`."""
    lo = sum((input_weight(dist, tk) for tk, ok in verdicts.items() if ok is True), Fraction(0))
    hi = sum((input_weight(dist, tk) for tk, ok in verdicts.items() if ok is not False), Fraction(0))
    return lo, hi
