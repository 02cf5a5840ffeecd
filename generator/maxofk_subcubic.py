"""Subcubic Max-of-K proofs (float generator side): gap-based counting over "sufficiently small" tokens.

For every query q, max token m and number c of non-max copies, the proof certifies all inputs whose c
non-max non-query tokens are <= a cutoff j(q, m, c) < m, with O(1) work per (q, m, c) after O(d_vocab^2)
tables; no d_vocab^3 enumeration. Per case, with everything divided by the max token's numerator alpha:

    u Tm(q,m) + rho(q,m,j) (P - u) max(Smax(q,m,j), 0) + r(q,m) Tq(q,m) < 0   at both ends of u's range

    rho  >= exp(-(lower bound of EQKE[q,m] - EQKE[q,k])) over k <= j       (attention to a non-max key)
    Smax >= max_{x != m} EU[q,x] - EU[q,m] + max_{k <= j} (max_{x != m} EV[k,x] - EV[k,m]) + max_{x != m} Pn_m[x]
    Tm   >= max_{x != m} (EU + EV_m + Pn_m centred at m)    via the mean+diff trick on EU
    Tq   =  max_{x != m} F_q[x] - F_q[m],  F_q = EU[q] + EV[q] + PV[n-1]  (exact, top-2 per row)
    r    =  e_q / alpha = exp(EQKE[q,q] - EQKE[q,m]) pw[q,n-1]

Variants for EQKE: "svd" (rank-1 factors from the SVD plus a max-row-diff bound on the remainder, no
d_vocab^2 x d_model product) and "exact-eqke" (EQKE multiplied out).
"""

import math

import numpy as np

from .accuracy import SLACK, TINY, position_sums

VARIANTS = ("svd", "exact-eqke")


def top2_excl(M):
    """X[r, m] = max_{x != m} M[r, x] for every row r and column m (top-2 per row)."""
    order = np.argsort(-M, axis=1)
    first = M[np.arange(M.shape[0]), order[:, 0]]
    second = M[np.arange(M.shape[0]), order[:, 1]]
    X = np.repeat(first[:, None], M.shape[1], axis=1)
    X[np.arange(M.shape[0]), order[:, 0]] = second
    return X


def svd_factors(model, T):
    """Rank-1 factors of EQKE = Q K^T / s: hint vectors x, y with Q x ~ sigma1 u1, K y ~ v1 (y.x ~ 1)."""
    c = model.config
    t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
    E, P = t["embed.W_E"], t["pos_embed.W_pos"]
    p = "blocks.0.attn."
    Q = (E + P[c.n_ctx - 1]) @ t[p + "W_Q"][0] + t[p + "b_Q"][0]
    K = E @ t[p + "W_K"][0]
    # top singular pair of Q K^T by power iteration on the factors: O(iterations * d_vocab * d_head)
    vk = np.ones(K.shape[0]) / np.sqrt(K.shape[0])
    for _ in range(200):
        u = Q @ (K.T @ vk)
        u /= np.linalg.norm(u)
        vk = K @ (Q.T @ u)
        sigma = np.linalg.norm(vk)
        vk /= sigma
    return Q, K, K.T @ vk, Q.T @ u / sigma


def score_bounds(model, T, variant):
    """(gap_lo[q, m, j], diff_lo[q, m], diff_hi[q, m], info): gap_lo <= (EQKE[q,m] - max_{k<=j} EQKE[q,k])
    and diff bounds of EQKE[q,q] - EQKE[q,m] (all divided by the attention scale)."""
    v = T["v"]
    if variant == "exact-eqke":
        EQKE = T["EQKE"]
        pre = np.maximum.accumulate(EQKE, axis=1)                  # (q, j)
        gap = EQKE[:, :, None] - pre[:, None, :]
        diff = np.diag(EQKE)[:, None] - EQKE
        return gap, diff, diff, {}
    Q, K, x, y = svd_factors(model, T)
    s = math.sqrt(model.config.d_head) if model.config.attn_scale is None else float(model.config.attn_scale)
    y = y / (y @ x)
    a, b = Q @ x / s, K @ y
    A = Q - np.outer(Q @ x, y)
    Bp = K - np.outer(K @ y, x)
    eps = np.abs(A) @ (Bp.max(axis=0) - Bp.min(axis=0)) / s          # max row-diff of the remainder
    ab = a[:, None] * b[None, :]
    pre = np.where(a[:, None] >= 0, a[:, None] * np.maximum.accumulate(b)[None, :],
                   a[:, None] * np.minimum.accumulate(b)[None, :])
    gap = ab[:, :, None] - pre[:, None, :] - eps[:, None, None]
    diff = np.diag(ab)[:, None] - ab
    return gap, diff - eps[:, None], diff + eps[:, None], {"x": x, "y": y}


def value_bounds(T):
    """Tm[q, m], Tq[q, m], Smax[q, m, j] (float), as in the module docstring."""
    n, v = T["n"], T["v"]
    EU, EV, PV = T["EU"], T["EV"], T["PV"]
    Pn = (PV[: n - 1, None, :] - PV[: n - 1, :, None]).max(axis=0)     # (m, x)
    G = EV - np.diag(EV)[:, None] + Pn                                  # (m, x)
    mu = EU.mean(axis=0)
    d = EU - mu
    Amax = np.diag(top2_excl(mu[None, :] + G)) - mu                     # (m,)
    Tm = Amax[None, :] + d.max(axis=1)[:, None] - d                    # (q, m)
    F = EU + EV + PV[n - 1][None, :]
    Tq = top2_excl(F) - F
    EUp = top2_excl(EU) - EU                                            # (q, m)
    R = (top2_excl(EV) - EV).T + np.diag(top2_excl(Pn))[:, None]        # (m, k)
    Rpre = np.maximum.accumulate(R, axis=1)                             # (m, j)
    return Tm, Tq, EUp[:, :, None] + Rpre[None, :, :]


def subcubic_evidence(model, T, name=None):
    """(evidence, count, info) for subcubic variant `name` (default "svd")."""
    from .accuracy import attention_weights
    variant = name or "svd"
    if variant not in VARIANTS:
        raise ValueError(f"unknown subcubic variant {variant!r} (known: {', '.join(VARIANTS)})")
    n, v = T["n"], T["v"]
    _, pw, _ = attention_weights(T)
    lo, hi, P = position_sums(pw, n)
    gap, dlo, dhi, hint = score_bounds(model, T, variant)
    Tm, Tq, Smax = value_bounds(T)
    r_up = np.where(Tq >= 0, np.exp(dhi), np.exp(dlo)) * pw[:, n - 1][:, None]
    np.fill_diagonal(r_up, pw[:, n - 1])
    rho = np.exp(-gap)                                                  # (q, m, j)
    cases, count = [], 0
    for m in range(v):
        for q in range(m + 1):
            D = r_up[q, m] * Tq[q, m]
            for c in range(0, (n - 1 if q == m else n - 2) + 1):
                if c == 0:
                    terms = [P[q] * Tm[q, m], D]
                    if sum(terms) < -SLACK * sum(abs(t) for t in terms) - TINY:
                        cases.append([m, q, 0, 0])
                        count += 1
                    continue
                r = n - 1 - c
                S = np.maximum(Smax[q, m, :m], 0)
                ok = np.ones(m, dtype=bool)
                for u in (lo[q, r], hi[q, r]):
                    A = u * Tm[q, m]
                    Bt = rho[q, m, :m] * (P[q] - u) * S
                    ok &= A + Bt + D < -SLACK * (abs(A) + np.abs(Bt) + abs(D)) - TINY
                j = int(np.argmin(ok)) - 1 if not ok.all() else m - 1    # largest prefix of good cutoffs
                if j >= 0:
                    cases.append([m, q, c, j])
                    count += math.comb(n - 1, c) * (j + 1) ** c
    evidence = {"strategy": "subcubic", "variant": variant, "cases": cases}
    if variant == "svd":
        from . import certio
        evidence["x"] = [certio.num(float(a)) for a in hint["x"]]
        evidence["y"] = [certio.num(float(a)) for a in hint["y"]]
    d, dh = model.config.d_model, model.config.d_head
    eqke = "d_vocab * d_model * d_head" if variant == "svd" else "d_vocab^2 * d_head"
    info = {"complexity": f"O(d_vocab^2 * (d_model + n_ctx) + {eqke})", "variant": variant,
            "flops": subcubic_flops(v, n, d, dh, variant),
            "checker_flops": subcubic_flops(v, n, d, dh, variant) - (1600 * v * dh if variant == "svd" else 0)}
    return evidence, count, info


def subcubic_flops(v, n, d, dh, variant) -> int:
    """Counted FLOPs: EU, EV, PV tables (2 v^2 d + ...), EQKE part, O(v^2 n) derived tables, O(v^2 n) cases."""
    tables = 2 * (v * d * v + v * d * dh + dh * d * v + d * dh * v + v * d * v + n * d * v + v * d * dh)
    eqke = 2 * (v * d * dh * 2 + 4 * v * dh + 200 * 4 * v * dh) if variant == "svd" else 2 * v * v * dh
    return tables + eqke + 12 * v * v * n + v * v * n * 12
