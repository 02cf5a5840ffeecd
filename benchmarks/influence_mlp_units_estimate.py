"""Float estimate: how much would per-hidden-unit weights in the MLP's even half lower C_abs of `spread<k>.joint`?

    python benchmarks/influence_mlp_units_estimate.py MODEL.safetensors [...]   (relu, parallel, shared-LN text
    models, as benchmarks/influence_joint_headroom.py; needs torch, the train extra)

The joint bound (docs/influence.md, step 6, "The moves added as one vector") bounds an MLP's even half z_e W_out
by ||z_e|| ||W_out u||. For any positive diagonal T, |z_e W_out u| <= ||z_e T^(-1/2)|| ||T^(1/2) W_out u||, and per
unit z_e,k^2 <= lambda_k a_k^2 + (1 - lambda_k) b_k^2 (lambda_k in [0, 1]), so the MLP pair's share becomes
R^2 max(P + mu_1, mu_2) + 2 R sqrt(mu_2) y + y^2 with mu_1 = lmax(M (I - Lambda) T^-1 M^T), mu_2 = lmax(M Lambda
T^-1 M^T), y = ||z0 Lambda^(1/2) T^(-1/2)||, and its even Gram W_out^T T W_out (T = I, lambda = 1/2-ish: today's
terms). This script re-evaluates the joint bound in float64 from the checker's own terms (heads, balls: midpoints
of its interval Gram matrices) and minimises it by Adam over, per line:
  rule      today's bound re-evaluated (the checker's weights, best over MLP_SCALES): must equal C_abs;
  T         per-unit T (scalar lambda, i.e. M -> M T^(-1/2), W_out -> T^(1/2) W_out in today's formulas), the
            checker's weight rule c = zeta / ||A|| (best over MLP_SCALES);
  weights   today's MLP terms, every weight free (the heads' and both MLP weights);
  lambda,T  per-unit lambda and T and every weight free.
Float only: nothing here is certified. Prints each figure against the certified C_abs.

    python benchmarks/influence_mlp_units_estimate.py --corner MODEL.safetensors [...]

instead prints, per block >= 1 and angle theta (|v| = R cos theta, |s| = R sin theta, s orthogonal to v, as when |g|
= |g'| = R): today's bound of the even half, ||W_out|| (m R min(cos theta, sin theta) + ||z0||), and the largest value
found by projected ascent of each link of that bound: ||W_out|| min(||a||, ||b||), ||W_out|| ||min(|a|, |b|)||,
||z_e W_out|| (the even half itself), the whole move ||f(g) - f(g')||, beside the linear half R cos theta ||M W_out||.
"""

import sys

import numpy as np
import torch

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.blocks import block, embedding
from tcert.checker.kinds.influence.joint import MLP_SCALES
from tcert.checker.kinds.influence.vocabulary import value_sets
from tcert.checker.modelfile import load_model
from tcert.generator.influence.ledger import FillLedger

torch.set_default_dtype(torch.float64)
STEPS = 600


def final_terms(model, B):
    """The last block's joint-bound variants (lists of made terms), as certified_needs derives them."""
    ld = FillLedger()
    state = embedding(B, ld, model, model.config.n_ctx)
    finite = value_sets(B, model, state.reach.embeds) if model.config.positional_embedding_type != "standard" else None
    for layer in range(model.config.n_layers):
        state = block(B, ld, model, layer, state, model.config.n_ctx, 6, finite)
    return [[make() for make in terms] for terms in state.terms], float(state.spread)


def mlp_parts(model, layer):
    """M (folded W_in), W_out, z0 of block `layer`'s MLP in float64 (shared LN1, as the text models)."""
    t, p = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}, f"blocks.{layer}."
    d = t[p + "ln1.w"].shape[0]
    M = (np.eye(d) - 1 / d) @ (t[p + "ln1.w"][:, None] * t[p + "mlp.W_in"])
    z0 = t[p + "ln1.b"] @ t[p + "mlp.W_in"] + t[p + "mlp.b_in"]
    W = t[p + "mlp.W_out"]
    return {"M": torch.tensor(M), "W": torch.tensor(W), "z0": torch.tensor(z0), "A": torch.tensor((M @ W).T @ (M @ W)),
            "mu": float(np.linalg.norm(M @ W, 2))}


def pair(mode, d, v, R, scale):
    """(share, Gram) of one MLP pair under `mode` with variables v (see the module docstring)."""
    lmax = lambda X: torch.linalg.eigvalsh(X)[-1]
    if mode in ("rule", "T"):
        S = torch.exp(v["y"] / 2) if mode == "T" else torch.ones(d["M"].shape[1])
        M, W, z0 = d["M"] / S, d["W"] * S[:, None], d["z0"] / S
        m, w, z = torch.linalg.matrix_norm(M, 2), torch.linalg.matrix_norm(W, 2), torch.linalg.vector_norm(z0)
        c_l, c_e = torch.tensor(scale * R / d["mu"]), scale * m * R / w
        P, Q = 1 / c_l, m * m / c_e
        return R * R * torch.maximum(P, (P + Q) / 2) + (2 * m * z * R + z * z) / c_e, c_l * d["A"] + c_e * W.T @ W
    c_l = torch.exp(v["c"])
    lam = torch.sigmoid(v["x"]) if mode == "lambda,T" else torch.full_like(v["x"], 0.5)
    T = torch.exp(v["y"]) if mode == "lambda,T" else torch.exp(v["e"]) * torch.ones_like(v["y"])
    M, Ti = d["M"], 1 / torch.exp(v["y"]) if mode == "lambda,T" else 1 / T
    mu1, mu2 = lmax((M * ((1 - lam) * Ti)) @ M.T), lmax((M * (lam * Ti)) @ M.T)
    y = torch.sqrt((d["z0"] ** 2 * lam * Ti).sum())
    share = R * R * torch.maximum(1 / c_l + mu1, mu2) + 2 * R * torch.sqrt(mu2) * y + y * y
    if mode == "weights":   # today's share: min(|a|,|b|) <= |a|, |b| norms, lambda = 1/2 is its scalar optimum at P <= Q
        m, z = torch.linalg.matrix_norm(M, 2), torch.linalg.vector_norm(d["z0"])
        P, Q = 1 / c_l, m * m / T[0]
        share = R * R * torch.maximum(P, (P + Q) / 2) + (2 * m * z * R + z * z) / T[0]
    return share, c_l * d["A"] + (d["W"].T * T) @ d["W"]


def minimise(made, mlps, mode, R, scale):
    """The smallest joint bound found for one variant of terms under `mode`."""
    others = [(float(c), g, float(s)) for c, g, s, is_mlp in made if not is_mlp and c > 0]
    eye = torch.eye(mlps[0]["M"].shape[0])
    gram_of = lambda g: eye if g is None else torch.tensor(sum(make_backend("flint").float_ends(g)) / 2)
    others = [(c, gram_of(g), s) for c, g, s in others]
    free = mode in ("weights", "lambda,T")
    logs = torch.zeros(len(others), requires_grad=free)
    vs = [{"x": torch.full((d["M"].shape[1],), 2.0, requires_grad=True), "y": torch.zeros(d["M"].shape[1], requires_grad=True),
           "c": torch.tensor(float(np.log(R / d["mu"])), requires_grad=True), "e": torch.tensor(0.0, requires_grad=True)}
          for d in mlps]
    params = ([logs] if free else []) + [v[k] for v in vs for k in {"rule": [], "T": ["y"], "weights": ["c", "e"],
                                                                      "lambda,T": ["x", "y", "c"]}[mode]]
    opt, best = (torch.optim.Adam(params, lr=0.02) if params else None), np.inf
    for _ in range(STEPS if params else 1):
        gram = sum(c * torch.exp(s) * g for (c, g, _), s in zip(others, logs))
        total = sum(sh / torch.exp(s) for (_, _, sh), s in zip(others, logs))
        for d, v in zip(mlps, vs):
            share, g = pair(mode, d, v, R, scale)
            total, gram = total + share, gram + g
        value = torch.sqrt(total * torch.linalg.eigvalsh(gram)[-1])
        best = min(best, float(value.detach()))
        if opt is not None:
            opt.zero_grad()
            torch.log(value).backward()
            opt.step()
    return best


def estimate(path):
    """{mode: the smallest joint bound found} and the certified C_abs for the model at `path`."""
    model = load_model(path)
    variants, c_abs = final_terms(model, make_backend("flint"))
    R = float(np.sqrt(model.config.d_model))
    mlps = [mlp_parts(model, k) for k in range(1, model.config.n_layers)]
    assert all(sum(t[3] for t in made) == 2 * len(mlps) for made in variants), "one split pair per block >= 1"
    out = {}
    for mode in ("rule", "T", "weights", "lambda,T"):
        scales = [float(s) for s in MLP_SCALES] if mode in ("rule", "T") else [1.0]
        out[mode] = min(minimise(made, mlps, mode, R, s) for made in variants for s in scales)
    return out, c_abs


def ascent(d, R, theta, link, starts=6, steps=400):
    """The largest `link` found over s orthogonal to v, |v| = R cos theta, |s| = R sin theta (centred; Adam)."""
    M, W, z0 = d["M"], d["W"], d["z0"]
    dim, w, best = M.shape[0], float(torch.linalg.matrix_norm(d["W"], 2)), 0.0
    centre, rng = torch.eye(M.shape[0]) - 1 / M.shape[0], np.random.default_rng(0)
    for _ in range(starts):
        s, v = (torch.tensor(rng.normal(size=dim), requires_grad=True) for _ in range(2))
        opt = torch.optim.Adam([s, v], lr=0.05)
        for _ in range(steps):
            vv = centre @ v
            vv = vv / vv.norm() * R * np.cos(theta)
            ss = centre @ s
            ss = ss - (ss @ vv) / (vv @ vv) * vv
            ss = ss / (ss.norm() + 1e-12) * R * np.sin(theta)
            a, b = ss @ M + z0, vv @ M
            value = {"min_norms": torch.minimum(a.norm(), b.norm()) * w,
                     "norm_min": torch.minimum(a.abs(), b.abs()).norm() * w,
                     "even": (((a + b).abs() - (a - b).abs()) / 2 @ W).norm(),
                     "move": ((torch.relu(a + b) - torch.relu(a - b)) @ W).norm()}[link]
            best = max(best, float(value.detach()))
            opt.zero_grad()
            (-value).backward()
            opt.step()
    return best


def corner(path, thetas=(0.0, 0.3, 0.5, np.pi / 4, 1.0)):
    """Print the links of the even half's bound per block >= 1 and angle (see the module docstring)."""
    model = load_model(path)
    R = float(np.sqrt(model.config.d_model))
    for k in range(1, model.config.n_layers):
        d = mlp_parts(model, k)
        m, w = float(torch.linalg.matrix_norm(d["M"], 2)), float(torch.linalg.matrix_norm(d["W"], 2))
        for th in thetas:
            found = {link: ascent(d, R, th, link) for link in ("min_norms", "norm_min", "even", "move")}
            bound = m * w * R * min(np.cos(th), np.sin(th)) + w * float(d["z0"].norm())
            print(f"{path} block {k} theta {th:.3f}: bound {bound:.2f}; "
                  + "; ".join(f"{link} {v:.2f}" for link, v in found.items()) + f"; linear {R * np.cos(th) * d['mu']:.2f}")


if __name__ == "__main__" and sys.argv[1:2] == ["--corner"]:
    for model_path in sys.argv[2:]:
        corner(model_path)
elif __name__ == "__main__":
    for model_path in sys.argv[1:]:
        found, certified = estimate(model_path)
        print(f"{model_path}: certified C_abs {certified:.2f}; " + "; ".join(
            f"{mode} {value:.2f} ({value / certified - 1:+.1%})" for mode, value in found.items()))
