"""Subcubic Max-of-K proofs (float generator side): gap-based counting over "sufficiently small" tokens.

For every query q, max token m and number c of non-max copies, the proof certifies all inputs whose c
non-max non-query tokens are <= a cutoff j(q, m, c) < m, with O(1) work per (q, m, c) after O(d_vocab^2)
tables; no d_vocab^3 enumeration. Per case, with everything divided by the max token's numerator alpha:

    u Tm(q,m) + rho(q,m,j) (P - u) max(Smax(q,m,j), 0) + r(q,m) Tq(q,m) < 0   at both ends of u's range

    rho  >= exp(-(lower bound of EQKE[q,m] - EQKE[q,k])) over k <= j       (attention to a non-max key)
    Smax >= max_{x != m} EU[q,x] - EU[q,m] + max_{k <= j} (max_{x != m} EVOU[k,x] - EVOU[k,m]) + max_{x != m} Pn_m[x]
    Tm   >= max_{x != m} (EU + EVOU_m + Pn_m centred at m)    via the mean+diff trick on EU
    Tq   =  max_{x != m} F_q[x] - F_q[m],  F_q = EU[q] + EVOU[q] + PVOU[n-1]  (exact, top-2 per row)
    r    =  e_q / alpha = exp(EQKE[q,q] - EQKE[q,m]) pw[q,n-1]

Variants for EQKE: "svd" (rank-1 factors from the SVD plus a max-row-diff bound on the remainder, no
d_vocab^2 x d_model product), "svd2" (the same with the top two singular pairs), "svd-rec" (the rank-1
split applied recursively to the remainder, r times, each step a projection, before the max-row-diff bound)
and "exact-eqke" (EQKE multiplied out).
"""

import math

import numpy as np

from tcert.generator import certificate
from tcert.generator.accuracy.tables import SLACK, TINY, attention_weights, max_excluding, position_sums

VARIANTS = ("svd", "svd2", "svd-rec", "exact-eqke")
EU_GROUPS = 32        # query groups of the +eu option (the checker accepts at most 32)
REC_RANK = 8          # default number of successive rank-1 deflations of the svd-rec variant


def query_key_factors(model):
    """Q = (E + P_last) W_Q + b_Q and K = E W_K (float64): EQKE = Q K^T / s without forming it."""
    c = model.config
    t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
    E, P = t["embed.W_E"], t["pos_embed.W_pos"]
    p = "blocks.0.attn."
    return (E + P[c.n_ctx - 1]) @ t[p + "W_Q"][0] + t[p + "b_Q"][0], E @ t[p + "W_K"][0]


def svd_factors(model, T):
    """Rank-1 factors of EQKE = Q K^T / s: hint vectors x, y with Q x ~ sigma1 u1, K y ~ v1 (y.x ~ 1)."""
    Q, K = query_key_factors(model)
    # top singular pair of Q K^T by power iteration on the factors: O(iterations * d_vocab * d_head)
    vk = np.ones(K.shape[0]) / np.sqrt(K.shape[0])
    e = np.eye(Q.shape[1])[0]                # fallback when Q K^T kills the iterate: any y.x != 0 is valid
    for _ in range(200):
        u = Q @ (K.T @ vk)
        if not np.linalg.norm(u) > 0:
            return Q, K, e, e
        u /= np.linalg.norm(u)
        vk = K @ (Q.T @ u)
        sigma = np.linalg.norm(vk)
        if not sigma > 0:
            return Q, K, e, e
        vk /= sigma
    return Q, K, K.T @ vk, Q.T @ u / sigma


def svd2_factors(model):
    """Rank-2 hints: X = [x1, x2], Y = [y1, y2] with Q x_i = sigma_i u_i, K y_i = sigma_i v_i for the top
    two singular pairs of Q K^T, from thin QR factors (O(d_vocab d_head^2); EQKE is never formed)."""
    Q, K = query_key_factors(model)
    UQ, RQ = np.linalg.qr(Q)
    UK, RK = np.linalg.qr(K)
    W, sig, Zt = np.linalg.svd(RQ @ RK.T)
    U, V = UQ @ W[:, :2], UK @ Zt[:2].T                     # top-2 left / right singular vectors of Q K^T
    X, Y = K.T @ V, Q.T @ U                                 # Y^T X = diag(sigma_1, sigma_2)
    if sig[1] <= 1e-6 * sig[0]:
        # numerically rank 1 (Y^T X near-singular): any second pair with Y^T X invertible is valid;
        # take x2 = y2 orthogonal to x1 and y1, so Y^T X = diag(y1.x1, |x2|^2)
        basis = np.linalg.qr(np.column_stack([X[:, 0], Y[:, 0], np.eye(len(X))]))[0]
        X[:, 1] = Y[:, 1] = basis[:, 2]
    if not sig[0] > 0:                       # Q K^T = 0: any pair with Y^T X invertible is valid
        X = Y = np.eye(Q.shape[1])[:, :2]
    return Q, K, X, Y


def score_bounds(model, T, variant, rank=REC_RANK):
    """((ab, pre, eps), diff_lo[q, m], diff_hi[q, m], info): gap_lo[q, m, j] = ab[q, m] - pre[q, j] - eps[q]
    <= EQKE[q,m] - max_{k<=j} EQKE[q,k] (formed per (q, m) by the caller: no d_vocab^3 array), and
    bounds of EQKE[q,q] - EQKE[q,m] (all divided by the attention scale)."""
    v = T["v"]
    if variant == "exact-eqke":
        EQKE = T["EQKE"]
        pre = np.maximum.accumulate(EQKE, axis=1)                  # (q, j)
        diff = np.diag(EQKE)[:, None] - EQKE
        return (EQKE, pre, np.zeros(v)), diff, diff, {}
    if variant == "svd2":
        return svd2_score_bounds(model)
    if variant == "svd-rec":
        return deflated_score_bounds(model, rank)
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
    diff = np.diag(ab)[:, None] - ab
    return (ab, pre, eps), diff - eps[:, None], diff + eps[:, None], {"x": x, "y": y}


def svd2_score_bounds(model):
    """`score_bounds` for the rank-2 variant: EQKE = a b^T + A B'^T / s with Y' = Y (Y^T X)^-T."""
    Q, K, X, Y = svd2_factors(model)
    c = model.config
    s = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
    Yp = Y @ np.linalg.inv(Y.T @ X).T
    a, b = Q @ X / s, K @ Yp
    A = Q - (Q @ X) @ Yp.T
    Bp = K - (K @ Yp) @ X.T
    eps = np.abs(A) @ (Bp.max(axis=0) - Bp.min(axis=0)) / s
    ab = a @ b.T
    pre = np.maximum.accumulate(ab, axis=1)
    diff = np.diag(ab)[:, None] - ab
    return (ab, pre, eps), diff - eps[:, None], diff + eps[:, None], {"x": X.T, "y": Y.T}


def deflation_hints(model, rank: int):
    """Hint pairs for the svd-rec variant: x_i = K^T v_i, y_i = Q^T u_i for the top `rank` singular pairs
    of Q K^T (thin QR factors and a d_head x d_head SVD; EQKE is never formed), stopping at numerical
    rank. Successive deflation by x_i y_i^T / (y_i . x_i) then removes sigma_i u_i v_i^T exactly (in reals)."""
    Q, K = query_key_factors(model)
    UQ, RQ = np.linalg.qr(Q)
    UK, RK = np.linalg.qr(K)
    W, sig, Zt = np.linalg.svd(RQ @ RK.T)
    r = max(1, min(rank, int(np.count_nonzero(sig > 1e-9 * max(sig[0], 1e-300)))))
    U, V = UQ @ W[:, :r], UK @ Zt[:r].T
    X, Y = (K.T @ V).T, (Q.T @ U).T
    if not sig[0] > 0:                       # Q K^T = 0: any projection is valid
        X = Y = np.eye(Q.shape[1])[:1]
    return Q, K, X, Y


def deflated_score_bounds(model, rank: int):
    """`score_bounds` for the svd-rec variant, mirroring `tcert.checker.kinds.accuracy.tables.deflated_scores` in floats."""
    Q, K, X, Y = deflation_hints(model, rank)
    c = model.config
    s = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
    ab = np.zeros((Q.shape[0], K.shape[0]))
    for x, y in zip(X, Y):
        yp = y / (y @ x)
        Qx, Ky = Q @ x, K @ yp
        ab += np.outer(Qx / s, Ky)
        Q, K = Q - np.outer(Qx, yp), K - np.outer(Ky, x)
    eps = np.abs(Q) @ (K.max(axis=0) - K.min(axis=0)) / s
    pre = np.maximum.accumulate(ab, axis=1)
    diff = np.diag(ab)[:, None] - ab
    return (ab, pre, eps), diff - eps[:, None], diff + eps[:, None], {"x": X, "y": Y}


def value_bounds(T, groups=None):
    """Tm[q, m], Tq[q, m], EUp[q, m], Rpre[m, j] (float): Smax[q, m, j] = EUp[q, m] + Rpre[m, j].
    With `groups` (the EU option), Tm is the smaller of the mean+diff bound and the grouped one."""
    n = T["n"]
    EU, EVOU, PVOU = T["EU"], T["EVOU"], T["PVOU"]
    Pn = (PVOU[: n - 1, None, :] - PVOU[: n - 1, :, None]).max(axis=0)     # (m, x)
    G = EVOU - np.diag(EVOU)[:, None] + Pn                                 # (m, x)
    Tm = mean_diff_tm(EU, G, np.arange(EU.shape[0]))
    if groups is not None:
        for g in np.unique(groups):
            rows = np.nonzero(groups == g)[0]
            Tm[rows] = np.minimum(Tm[rows], mean_diff_tm(EU, G, rows))
    F = EU + EVOU + PVOU[n - 1][None, :]
    Tq = max_excluding(F) - F
    EUp = max_excluding(EU) - EU                                                # (q, m)
    R = (max_excluding(EVOU) - EVOU).T + np.diag(max_excluding(Pn))[:, None]    # (m, k)
    Rpre = np.maximum.accumulate(R, axis=1)                             # (m, j)
    return Tm, Tq, EUp, Rpre


def mean_diff_tm(EU, G, rows):
    """Mean+diff bound of Tm for the query rows `rows` with their mean row as the centre:
    max_{x != m} (EU[q,x] + G[m,x]) <= max_{x != m} (mu[x] + G[m,x]) + max_x (EU[q,x] - mu[x])."""
    mu = EU[rows].mean(axis=0)
    d = EU[rows] - mu
    centre_max = np.diag(max_excluding(mu[None, :] + G)) - mu             # (m,)
    return centre_max[None, :] + d.max(axis=1)[:, None] - d              # (rows, m)


def eu_groups(EU, k: int, iters: int = 30):
    """The EU option's hint: k groups of query tokens by k-means on the centred EU rows (farthest-point
    start, deterministic; O(iters k d_vocab^2)). Rows of a group share one centre in the Tm bound."""
    X = EU - EU.mean(axis=1, keepdims=True)
    C = [X.mean(axis=0)]
    for _ in range(k - 1):
        C.append(X[int(np.argmax(np.min([((X - c) ** 2).sum(axis=1) for c in C], axis=0)))])
    C = np.array(C)
    for _ in range(iters):
        lab = np.argmin(((X[:, None, :] - C[None]) ** 2).sum(axis=2), axis=1)
        C = np.array([X[lab == g].mean(axis=0) if np.any(lab == g) else C[g] for g in range(k)])
    return np.unique(lab, return_inverse=True)[1]           # ids 0..(used groups - 1)


def parse_name(name):
    """(variant, rank, option) of a subcubic strategy name VARIANT[+eu] (svd-recN: N deflation steps);
    ValueError for an unknown name."""
    base, plus, option = (name or "svd").partition("+")
    if plus and option != "eu":
        raise ValueError(f"unknown subcubic option {option!r} (known: +eu)")
    variant, rank = base, REC_RANK
    if variant.startswith("svd-rec") and variant[7:].isdigit() and int(variant[7:]) >= 1:
        variant, rank = "svd-rec", int(variant[7:])
    if variant not in VARIANTS:
        raise ValueError(f"unknown subcubic variant {variant!r} (known: {', '.join(VARIANTS)}, svd-recN)")
    return variant, rank, option


def subcubic_evidence(model, T, name=None):
    """(evidence, count, info) for subcubic variant `name` (default "svd")."""
    variant, rank, option = parse_name(name)
    _, pw, _ = attention_weights(T)
    scores, dlo, dhi, hint = score_bounds(model, T, variant, rank)
    groups = eu_groups(T["EU"], min(EU_GROUPS, T["v"])) if option == "eu" else None
    cases, count = subcubic_cases(T, pw, scores, dlo, dhi, value_bounds(T, groups))
    evidence = {"strategy": "subcubic", "variant": variant, "cases": cases}
    if groups is not None:
        evidence["eu_groups"] = [int(g) for g in groups]
    if variant in ("svd", "svd2", "svd-rec"):
        for key in ("x", "y"):
            vec = np.asarray(hint[key])
            evidence[key] = [certificate.num(float(a)) for a in vec] if vec.ndim == 1 else \
                [[certificate.num(float(a)) for a in row] for row in vec]
    rec_rank = len(hint["x"]) if variant == "svd-rec" else 0
    groups_used = len(set(evidence.get("eu_groups", [])))
    return evidence, count, subcubic_info(model.config, variant + ("+" if option else "") + option, rec_rank,
                                          groups_used)


def subcubic_cases(T, pw, scores, dlo, dhi, values):
    """The claimed [m, q, c, cutoff] cases (per (m, q, c) the largest prefix of safely correct cutoffs) and
    the number of inputs they cover."""
    n, v = T["n"], T["v"]
    smallest, largest, P = position_sums(pw, n)
    ab, pre, eps = scores
    Tm, Tq, EUp, Rpre = values
    r_up = np.where(Tq >= 0, np.exp(dhi), np.exp(dlo)) * pw[:, n - 1][:, None]
    np.fill_diagonal(r_up, pw[:, n - 1])
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
                rho = np.exp(-(ab[q, m] - pre[q, :m] - eps[q]))   # exp(-gap[q, m, j]), j < m
                S = np.maximum(EUp[q, m] + Rpre[m, :m], 0)         # Smax[q, m, j]
                ok = np.ones(m, dtype=bool)
                for u in (smallest[q, r], largest[q, r]):
                    A = u * Tm[q, m]
                    Bt = rho * (P[q] - u) * S
                    mag = abs(A) + rho * P[q] * S + abs(D)          # P - u cancels: slack on P, not P - u
                    ok &= A + Bt + D < -SLACK * mag - TINY
                j = int(np.argmin(ok)) - 1 if not ok.all() else m - 1    # largest prefix of good cutoffs
                if j >= 0:
                    cases.append([m, q, c, j])
                    count += math.comb(n - 1, c) * (j + 1) ** c
    return cases, count


def subcubic_info(cfg, variant_name: str, rec_rank: int, groups_used: int) -> dict:
    """The certificate's informational generator fields: asymptotic complexity and counted FLOPs (the
    generator's and the checker's share), for `variant_name` = VARIANT[+eu]."""
    v, n, d, dh = cfg.d_vocab, cfg.n_ctx, cfg.d_model, cfg.d_head
    variant = variant_name.partition("+")[0]
    eqke = {"svd": "d_vocab * d_model * d_head", "svd2": "d_vocab * d_model * d_head + d_vocab^2",
            "svd-rec": f"d_vocab * d_model * d_head + r * d_vocab^2 (r = {rec_rank})",
            "exact-eqke": "d_vocab^2 * d_head"}[variant]
    k = groups_used
    eu = f" + groups * d_vocab^2 (groups = {k})" if k else ""
    eu_flops = 4 * (k + 1) * v * v                        # per group: centre, (max,+) row maxima, deviations
    return {"complexity": f"O(d_vocab^2 * (d_model + n_ctx) + {eqke}{eu})", "variant": variant_name,
            "flops": subcubic_flops(v, n, d, dh, variant, rec_rank) + (eu_flops + 30 * 2 * k * v * v if k else 0),
            "checker_flops": subcubic_flops(v, n, d, dh, variant, rec_rank) + (eu_flops if k else 0) - {
                "svd": 1600 * v * dh, "exact-eqke": 0, "svd2": 8 * v * dh * dh + 22 * dh ** 3,
                "svd-rec": 8 * v * dh * dh + 22 * dh ** 3}[variant]}


def subcubic_flops(v, n, d, dh, variant, r=0) -> int:
    """Counted FLOPs: EU, EVOU, PVOU tables (2 v^2 d + ...), EQKE part, O(v^2 n) derived tables, O(v^2 n) cases."""
    tables = 2 * (v * d * v + v * d * dh + dh * d * v + d * dh * v + v * d * v + n * d * v + v * d * dh)
    if variant == "svd":
        eqke = 2 * (v * d * dh * 2 + 4 * v * dh + 200 * 4 * v * dh)
    elif variant == "svd2":      # factors, 2 QR + a d_head^3 SVD (generator), A / B' products, the a.b table
        eqke = 2 * (v * d * dh * 2 + 8 * v * dh) + 4 * v * v + (2 * 4 * v * dh * dh + 22 * dh ** 3)
    elif variant == "svd-rec":  # factors, QR + SVD (generator), r deflation steps, the rank-r score table
        eqke = 2 * (v * d * dh * 2 + 4 * r * v * dh + 2 * v * dh) + 4 * r * v * v + (2 * 4 * v * dh * dh + 22 * dh ** 3)
    else:
        eqke = 2 * v * v * dh
    return tables + eqke + 12 * v * v * n + v * v * n * 12
