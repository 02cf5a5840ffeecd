"""Generate Max-of-K `accuracy` certificates: brute force, cubic and subcubic strategies (float, untrusted).

The model is a 1-layer attention-only transformer (one head, learned positions, no LayerNorm). With the
query at the last position n-1 and key token t at position i, everything the last logits depend on
splits into small tables (floats here; `tcert.checker.kinds.accuracy.tables` recomputes them rigorously):

    score(q; t, i) = EQKE[q, t] + EQKP[q, i]          (already divided by the attention scale)
    logits(x)      = EU[q, x] + sum_i a_i (EV[t_i, x] + PV[i, x]),  a = softmax(scores)

Every strategy decides, per case, whether logit(max) > logit(x) for all x != max, and claims only cases
whose float margin is safely negative (relative slack `SLACK`), so that the rigorous checker, whose
enclosures are far tighter than the slack, confirms them. See docs/accuracy.md for the arguments.
"""

import math
import time

import numpy as np

from tcert.checker.kinds.accuracy.tables import require_maxofk

from tcert.generator import certificate

SLACK = 1e-9          # relative float margin below which a case is not claimed
TINY = 1e-300


def float_tables(model) -> dict:
    """Float64 EQKE, EQKP (scores / attention scale), EU (direct path incl. constant biases), EV, PV."""
    c = model.config
    t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
    E, P = t["embed.W_E"], t["pos_embed.W_pos"]
    p = "blocks.0.attn."
    WQ, WK, WV, WO = t[p + "W_Q"][0], t[p + "W_K"][0], t[p + "W_V"][0], t[p + "W_O"][0]
    bQ, bK, bV, bO = t[p + "b_Q"][0], t[p + "b_K"][0], t[p + "b_V"][0], t[p + "b_O"]
    WU, bU = t["unembed.W_U"], t["unembed.b_U"]
    div = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
    n = c.n_ctx
    X = E + P[n - 1]
    Q = X @ WQ + bQ
    OU = WO @ WU
    return {
        "EQKE": Q @ (E @ WK).T / div,
        "EQKP": Q @ (P @ WK + bK).T / div,
        "EU": X @ WU + bU + (bV @ WO + bO) @ WU,
        "EV": E @ WV @ OU,
        "PV": P @ WV @ OU,
        "n": n, "v": c.d_vocab,
    }


def claim_for(model, count: int) -> dict:
    """The accuracy claim: correct (max token's logit strictly largest) on >= count inputs."""
    c = model.config
    return {"task": "max-of-k", "d_vocab": c.d_vocab, "n_ctx": c.n_ctx,
            "inputs": c.d_vocab ** c.n_ctx, "correct_at_least": int(count)}


# ------------------------------------------------------------------------------------------- brute force

def brute_count(model, T=None):
    """Float count of inputs whose logit gap exceeds SLACK times the input's own scale (claimed).

    Per query q: L[t_0..t_{n-2}, x] = sum_i H_i[t_i, x] with H_i[t, x] = w(q, i, t) (EU[q,x] + EV[t,x]
    + PV[i,x]) and w a positive multiple of the softmax numerator, so sign(L[m] - L[x]) is the sign
    of the logit gap. An input is claimed when L[x] < thr = L[m] - SLACK * scale for all x != m.
    Chunks: one (q, t_0) at a time, the last two non-query positions broadcast.

    Pruning (same decisions, fewer operations): per chunk, ub = max_{x != m}(H_a[t_a, x] + base[x])
    + max_{x != m} H_b[t_b, x] (top two per row, O(d_vocab^2)) is above every L[x], x != m, up to a few
    rounding units of `scale`; an input with ub + 1e-13 scale + 1e-290 < thr is therefore claimed by the
    full test too. Only the others (well under 1% on the anchors) get the full O(d_vocab) test, with the
    same float operations in the same order as before, so the count is unchanged.
    """
    T = T or float_tables(model)
    n, v = T["n"], T["v"]
    EQKE, EQKP, EU, EV, PV = T["EQKE"], T["EQKP"], T["EU"], T["EV"], T["PV"]
    toks = np.arange(v)
    outer = max(0, n - 3)
    inner = list(range(outer, n - 1))
    grids = np.meshgrid(*[toks] * len(inner), indexing="ij")
    gmax = np.maximum.reduce(list(grids))
    safe = 0
    for q in range(v):
        s = EQKE[q][None, :] + EQKP[q][:, None]          # (n, v): position i, key token t
        w = np.exp(s - s.max())
        H = w[:, :, None] * (EU[q][None, None, :] + EV[None, :, :] + PV[:, None, :])   # (i, t, x)
        A = np.abs(H).max(axis=2)                        # (i, t): scale of each term
        rest_ub = sum((excl_max(H[pos])[g] for pos, g in zip(inner[1:], grids[1:])), 0.0)  # (grid, m)
        inner_scale = sum(A[pos][g] for pos, g in zip(inner, grids))
        for pre in np.ndindex(*([v] * outer)):
            base = H[n - 1, q] + sum((H[j, t] for j, t in enumerate(pre)), np.zeros(v))
            scale = A[n - 1, q] + sum((A[j, t] for j, t in enumerate(pre)), 0.0)
            m = np.maximum(gmax, max((q,) + pre))
            Lm = base[m] + sum(H[pos][g, m] for pos, g in zip(inner, grids))
            scale = scale + inner_scale
            thr = Lm - SLACK * scale - TINY
            first = excl_max(H[inner[0]] + base)[grids[0], m]
            ub = first + (np.take_along_axis(rest_ub, m[..., None], axis=-1)[..., 0] if outer < n - 2 else 0.0)
            sure = ub + (1e-13 * scale + 1e-290) < thr
            safe += int(np.count_nonzero(sure))
            idx = np.nonzero(~sure)
            if len(idx[0]):
                rows = sum(H[pos][g[idx]] for pos, g in zip(inner, grids)) + base
                safe += int(np.count_nonzero((rows >= thr[idx][:, None]).sum(axis=-1) == 1))
    return safe


def excl_max(M):
    """X[r, m] = max_{x != m} M[r, x] (float; the top two of each row)."""
    r = np.arange(M.shape[0])
    top = M.argmax(axis=1)
    rest = M.copy()
    rest[r, top] = -np.inf
    X = np.repeat(M[r, top][:, None], M.shape[1], axis=1)
    X[r, top] = rest.max(axis=1)
    return X


def brute_flops(v, n, d_model, d_head) -> int:
    """Counted FLOPs of the brute-force generator: tables plus n adds and a max over d_vocab per input."""
    return tables_flops(v, n, d_model, d_head) + v * n * v * v * 3 + v ** n * v * (n + 2)


def tables_flops(v, n, d, dh) -> int:
    """FLOPs of EQKE, EQKP, EU, EV, PV as matrix products (2 per multiply-add)."""
    return 2 * (v * d * dh * 3 + v * dh * v + v * dh * n + n * d * dh + v * d * v + d * dh * v
                + dh * d * v + v * d * dh + n * d * dh)


# ------------------------------------------------------------------------------------------------ cubic

def attention_weights(T):
    """Per query q: e[q, t] = exp(EQKE[q, t] - max), pw[q, i] = exp(EQKP[q, i] - max), query weight."""
    EQKE, EQKP, n = T["EQKE"], T["EQKP"], T["n"]
    e = np.exp(EQKE - EQKE.max(axis=1, keepdims=True))
    pw = np.exp(EQKP - EQKP.max(axis=1, keepdims=True))
    eq = np.diag(e) * pw[:, n - 1]
    return e, pw, eq


def position_sums(pw, n):
    """lo[q, r] / hi[q, r]: sum of the r smallest / largest non-query positional weights; P[q] total."""
    srt = np.sort(pw[:, : n - 1], axis=1)
    zero = np.zeros((pw.shape[0], 1))
    lo = np.concatenate([zero, np.cumsum(srt, axis=1)], axis=1)
    hi = np.concatenate([zero, np.cumsum(srt[:, ::-1], axis=1)], axis=1)
    return lo, hi, srt.sum(axis=1)


def cubic_values(T, m: int):
    """For max token m (all centred at column m, maxima over x != m):

    Tm[q] = max_x EU[q,x] + EV[m,x] + Pn[x]      (max-token key at a non-query position)
    Tq[q] = max_x EU[q,x] + EV[q,x] + PV[n-1,x]  (the query key)
    S[q,k] = max_x EU[q,x] + max_x EV[k,x] + Pn[x]  (a non-max key k)
    where Pn[x] = max over non-query positions i of PV[i,x] (centred).
    """
    n = T["n"]
    EUc = T["EU"] - T["EU"][:, [m]]
    EVc = T["EV"] - T["EV"][:, [m]]
    PVc = T["PV"] - T["PV"][:, [m]]
    Pn = PVc[: n - 1].max(axis=0)
    keep = np.arange(T["v"]) != m
    EUk, EVk = EUc[:, keep], EVc[:, keep]
    Tm = (EUk + (EVk[m] + Pn[keep])[None, :]).max(axis=1)
    Tq = (EUk + EVk + PVc[n - 1, keep][None, :]).max(axis=1)
    S = EUk.max(axis=1)[:, None] + (EVk + Pn[keep][None, :]).max(axis=1)[None, :]
    return Tm, Tq, S


def cubic_cases(model, T=None):
    """The cubic proof in floats: list of (m, q, c, mask) with mask = bit k set when case (q, m, k, c)
    is safely correct (c = 0: mask 1 when the all-max filling is), and the total count they imply."""
    T = T or float_tables(model)
    n, v = T["n"], T["v"]
    e, pw, eq = attention_weights(T)
    lo, hi, P = position_sums(pw, n)
    cases, count = [], 0
    for m in range(v):
        Tm, Tq, S = cubic_values(T, m)
        for q in range(m + 1):
            top = n - 1 if q == m else n - 2
            for c in range(0, top + 1):
                r = n - 1 - c
                if c == 0:
                    terms = [e[q, m] * P[q] * Tm[q], eq[q] * Tq[q]]
                    ok = sum(terms) < -SLACK * sum(abs(x) for x in terms) - TINY
                    if ok:
                        cases.append((m, q, 0, 1))
                        count += 1
                    continue
                good = np.ones(m, dtype=bool)
                for u in (lo[q, r], hi[q, r]):
                    a = e[q, m] * u * Tm[q]
                    b = e[q, :m] * (P[q] - u) * S[q, :m]
                    d = eq[q] * Tq[q]
                    g = a + b + d
                    # the slack scales with e_k P |S|, not e_k (P - u) |S|: P - u cancels in floats (the
                    # checker's P - u is an interval of width ~2^-60 P, found by the large hypothesis run)
                    mag = abs(a) + e[q, :m] * P[q] * np.abs(S[q, :m]) + abs(d)
                    good &= g < -SLACK * mag - TINY
                if good.any():
                    mask = int(sum(1 << int(k) for k in np.nonzero(good)[0]))
                    cases.append((m, q, c, mask))
                    count += math.comb(n - 1, c) * int(good.sum()) ** c
    return cases, count


def cubic_flops(v, n, d, dh) -> int:
    """Counted FLOPs of the cubic strategy: tables, the per-max-token value tables (d_vocab^3 work)
    and the per-case evaluation (two endpoints, ~8 operations each, over d_vocab^3 n_ctx / 2 cases)."""
    per_m = 3 * v * v + 3 * v * v + 2 * v * v + n * v
    return tables_flops(v, n, d, dh) + v * per_m + (v ** 3 // 2) * (n - 1) * 2 * 8 + v * v * 4


# ----------------------------------------------------------------------------------------- certificates

def make_certificate(model, strategy: str, true_count: int | None = None):
    """(certificate, report) for `strategy` in brute | cubic | subcubic[:NAME]."""
    require_maxofk(model)
    c = model.config
    v, n = c.d_vocab, c.n_ctx
    start = time.perf_counter()
    T = float_tables(model)
    report = {"strategy": strategy}
    if strategy == "brute":
        count = brute_count(model, T)
        evidence = {"strategy": "brute"}
        true_count = count if true_count is None else true_count
        flops = brute_flops(v, n, c.d_model, c.d_head)
        info = {"complexity": "O(d_vocab^n_ctx * n_ctx * d_vocab)", "flops": flops, "checker_flops": flops}
    elif strategy == "cubic":
        cases, count = cubic_cases(model, T)
        evidence = {"strategy": "cubic",
                    "cases": [[m, q, cc, format(mask, "x")] for m, q, cc, mask in cases]}
        claimed = sum(bin(mask).count("1") if cc else 1 for _, _, cc, mask in cases)
        info = {"complexity": "O(d_vocab^3 * n_ctx^2)", "flops": cubic_flops(v, n, c.d_model, c.d_head),
                "checker_flops": tables_flops(v, n, c.d_model, c.d_head) + v * 8 * v * v + claimed * 2 * 12}
    elif strategy == "subcubic" or strategy.startswith("subcubic:"):
        from tcert.generator.accuracy.subcubic import subcubic_evidence
        evidence, count, info = subcubic_evidence(model, T, strategy.partition(":")[2] or None)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    report["generator_seconds"] = time.perf_counter() - start
    info = dict(info, strategy=strategy, bound=count, inputs=v ** n)
    if true_count is not None:
        info["true_count"] = int(true_count)
        info["bound_over_true"] = f"{count / true_count:.7f}" if true_count else "n/a"
    info["bound_over_inputs"] = f"{count / v ** n:.7f}"
    report.update(info)
    cert = certificate.envelope("accuracy", model, claim_for(model, count), evidence, info)
    return cert, report


# ------------------------------------------------------------------------------ estimate (never a certificate)

def estimate_accuracy(model, samples: int = 100_000, seed: int = 0) -> dict:
    """Stratified importance-sampled ESTIMATE of the accuracy, for K where brute force is out of reach.

    Strata: the max token m, of probability pi_m = ((m+1)^K - m^K) / d_vocab^K. Stratum m gets samples in
    proportion to sqrt(pi_m) (at least 64), so rare small-max inputs, where errors concentrate, are
    oversampled; inputs are drawn uniformly inside a stratum (rejection from [0, m]^K). The estimate is
    sum_m pi_m p_m with standard error sqrt(sum_m pi_m^2 p_m (1 - p_m) / n_m). Float64, no guarantee:
    it is printed as an estimate and never written into a certificate.
    """
    from tcert.generator.model.forward import logits
    c = model.config
    v, n = c.d_vocab, c.n_ctx
    rng = np.random.default_rng(seed)
    pi = np.array([((m + 1) ** n - m ** n) / v ** n for m in range(v)])
    alloc = np.maximum(64, np.round(samples * np.sqrt(pi) / np.sqrt(pi).sum())).astype(int)
    est = var = 0.0
    for m in range(v):
        want, rows = int(alloc[m]), []
        while sum(len(r) for r in rows) < want:
            draw = rng.integers(0, m + 1, size=(2 * want + 8, n))
            rows.append(draw[draw.max(axis=1) == m])
        toks = np.concatenate(rows)[:want]
        lg = logits(model, toks)
        right = lg[:, m].copy()
        lg[:, m] = -np.inf
        p = float(np.mean(right > lg.max(axis=1)))
        est += pi[m] * p
        var += pi[m] ** 2 * p * (1 - p) / want
    return {"estimate": est, "stderr": math.sqrt(var), "samples": int(alloc.sum()), "seed": seed,
            "note": "importance-sampled estimate (float64), not a certificate"}
