"""`influence`: one changed non-final token moves an L-layer model's last position by at most C r(n).

claim    {"n_min": int >= 2, "n_max": int <= n_ctx, "rate": "inverse" | "harmonic",
          "C": exact number, "C_prob": exact number, optional "corollary"}
         rate "inverse":  r(n) = 1/n            (bidirectional attention, or a 1-layer model)
         rate "harmonic": r(n) = H_n^(L-1) / n  (any mask; needed for causal models with L >= 2),
                          H_n = 1 + 1/2 + ... + 1/n
         "C_abs", "C_prob_abs": exact numbers (n-independent caps)
         Statement: for every n in [n_min, n_max] and every two inputs of length n that differ at one
         position i < n-1 (0-based; never the last), the final residual at the last position moves by
         ||y - y'||_2 <= min(C r(n), C_abs) and the next-token distribution by
         ||p - p'||_1 <= min(C_prob r(n), C_prob_abs).
         corollary {"prediction": prediction claim, "substitutions": R}: additionally, on that input
         x (length n in range) the greedy next token k is unchanged by ANY change of at most R of the
         positions 0..n-2, because R G lip_final min(C r(n), C_abs) < margin, G = max_j ||W_U[:,k]-W_U[:,j]||.
evidence {"power": p, "embed_center": [d numbers], "unembed_center": [d numbers],
          "constants": {name: exact number}}
         Every named constant is a claimed upper bound that the checker recomputes from the weights
         and from the constants before it (docs/influence.md gives each formula and its proof) and
         requires claimed >= recomputed. All formulas are monotone in their inputs, so recomputing
         from claimed (larger) predecessors is sound. Operator norms are checked by the trace-power
         bound ||W||_2 <= tr((W^T W)^(2^p))^(1/2^(p+1)).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int, parse_number, parse_vector
from tcert.checker.numbers import show
from tcert.checker.kinds.prediction import check_claim as check_prediction
from tcert.checker.kinds.prediction import parse_claim as parse_prediction

ROWS_PER_BLOCK = 64
MAX_POWER = 8


class Ledger:
    """The certificate's claimed constants; `const` checks one against its recomputed bound."""

    def __init__(self, claimed: dict, ob):
        self.claimed, self.ob, self.used = claimed, ob, set()

    def const(self, name: str, bound) -> Fraction:
        """Require claimed[name] >= bound() (a Fraction) and return the claimed value."""
        if name not in self.claimed:
            raise BadInput(f"evidence.constants: missing {name!r}")
        self.used.add(name)
        value, need = self.claimed[name], bound()
        self.ob.require(value >= need, f"constant {name}",
                        f"claimed {show(value)} is below the recomputed bound {show(need)}")
        return value


# --- rigorous norms from the weights -----------------------------------------------------------

def max_row_dists(B, arr, centers) -> list:
    """Upper bounds of max_r ||arr[r] - c||_2 for each centre c in `centers` (None: the zero vector),
    in one pass over the rows: ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2 with blockwise products."""
    arr = np.asarray(arr)
    cs = [[Fraction(0)] * arr.shape[1] if c is None else c for c in centers]
    cols = B.matrix([[B.num(x) for x in c] for c in cs]).T
    c_sq = [B.num(B.upper(row[j])) for j, row in enumerate((cols.T @ cols).rows())]
    best = [Fraction(0)] * len(cs)
    for s in range(0, arr.shape[0], ROWS_PER_BLOCK):
        blk = B.array(arr[s:s + ROWS_PER_BLOCK])
        g, x = (blk @ blk.T).rows(), (blk @ cols).rows()
        for j in range(len(cs)):
            best[j] = max([best[j]] + [B.upper(g[i][i] - 2 * x[i][j] + c_sq[j]) for i in range(blk.shape[0])])
    return [B.upper(B.sqrt(B.num(max(b, Fraction(0))))) for b in best]


def max_row_dist(B, arr, center=None) -> Fraction:
    """Upper bound of max_r ||arr[r] - center||_2 (center None: 0) over the rows of a 2-D array."""
    return max_row_dists(B, arr, [center])[0]


def vec_norm(B, v) -> Fraction:
    """Upper bound of the Euclidean norm of a stored vector."""
    return max_row_dist(B, np.asarray(v).reshape(1, -1))


def max_abs(B, v) -> Fraction:
    """max_i |v_i| of a stored vector, exactly."""
    return max(B.abs_upper(B.num(float(x))) for x in np.asarray(v).reshape(-1))


def opnorm(B, factors, power: int) -> Fraction:
    """Upper bound of the spectral norm of the product of `factors` (one or two stored matrices).

    With P the smaller Gram matrix (W W^T or W^T W; for V O it is (V^T V)(O O^T), whose eigenvalues
    are the non-zero eigenvalues of (VO)^T (VO)), all eigenvalues are >= 0, so
    lambda_max^m <= tr(P^m) for m = 2^power, and ||.||_2 <= tr(P^m)^(1/(2m)).
    """
    if len(factors) == 1:
        M = B.array(factors[0])
        P = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    else:
        V, O = B.array(factors[0]), B.array(factors[1])
        P = (V.T @ V) @ (O @ O.T)
    for _ in range(power):
        P = P @ P
    rows = P.rows()
    trace = B.upper(B.fsum(rows[i][i] for i in range(len(rows))))
    if trace <= 0:
        return Fraction(0)
    return B.upper(B.exp(B.log(B.num(trace)) / (2 ** (power + 1))))


# --- small rigorous scalar helpers -------------------------------------------------------------

def up_sqrt(B, q: Fraction) -> Fraction:
    """Upper bound of sqrt(q)."""
    return B.upper(B.sqrt(B.num(q)))


def lo_sqrt(B, q: Fraction) -> Fraction:
    """Lower bound of sqrt(q)."""
    return B.lower(B.sqrt(B.num(q)))


def act_lipschitz(B, act_fn: str) -> Fraction:
    """A Lipschitz constant of the MLP nonlinearity (docs/influence.md, 'MLP')."""
    if act_fn == "relu":
        return Fraction(1)
    if act_fn == "gelu":  # max |gelu'| = gelu'(sqrt 2) = Phi(sqrt 2) + sqrt 2 phi(sqrt 2)
        return B.upper((1 + B.erf(B.num(1))) / 2 + B.exp(B.num(-1)) / B.sqrt(B.pi()))
    return Fraction(3, 2)  # gelu_new: 1 + sup_u (u + 0.0527 u^3) e^(-u) < 3/2


def harmonic(n: int) -> Fraction:
    """H_n = 1 + 1/2 + ... + 1/n exactly."""
    return sum((Fraction(1, k) for k in range(1, n + 1)), Fraction(0))


def cap_factor(B, n_max: int, k: int, causal: bool) -> Fraction:
    """An upper bound of max_{m <= n_max} 1/rho_k(m): n_max when rho_k(m) = 1/n (bidirectional) or k = 1;
    max_m m / H_m^(k-1) when rho_k(m) = H_m^(k-1)/m (causal, after k >= 2 blocks)."""
    if not causal or k == 1:
        return Fraction(n_max)
    best, H = Fraction(0), B.num(0)
    for m in range(1, n_max + 1):
        H = H + B.num(1) / m
        best = max(best, B.upper(B.exp(B.log(B.num(m)) - (k - 1) * B.log(H))))
    return best


def rate(name: str, n: int, n_layers: int) -> Fraction:
    """r(n) of the claimed rate."""
    return Fraction(1, n) if name == "inverse" else harmonic(n) ** (n_layers - 1) / n


# --- the constants, block by block --------------------------------------------------------------

def layer_norm(B, ld, model, prefix, name, bound, eps, sqrt_d):
    """(Lipschitz constant, output-norm bound), constants `name`.lip/.out, of LN `prefix` on inputs of
    norm <= bound (identity if prefix is None)."""
    if prefix is None:
        return Fraction(1), bound
    w, b = model.tensors[prefix + ".w"], model.tensors[prefix + ".b"]
    wmax = max_abs(B, w)
    lip = ld.const(name + ".lip", lambda: B.upper(B.num(wmax) / B.sqrt(B.num(eps))))
    out = ld.const(name + ".out", lambda: vec_norm(B, b) + wmax * min(sqrt_d, B.upper(
        B.num(bound) / B.sqrt(B.num(eps)))))
    return lip, out


def attention_layer(B, ld, model, layer, U, lam, D, E, n_max, cap, power, causal):
    """Bounds for block `layer`'s attention: (output norm, change at i, change elsewhere).

    cap: a number with 1 <= cap * rho(m) for every position m <= n_max, rho the block's output weight."""
    cfg, t = model.config, model.tensors
    p = f"blocks.{layer}.attn."
    div = Fraction(cfg.attn_scale) if cfg.attn_scale is not None else lo_sqrt(B, Fraction(cfg.d_head))
    out_norm = ld.const(f"L{layer}.attn.b_O", lambda: vec_norm(B, t[p + "b_O"]))
    d_att, e_att = Fraction(0), Fraction(0)
    for h in range(cfg.n_heads):
        q = f"L{layer}.h{h}."
        sq = ld.const(q + "W_Q", lambda: opnorm(B, [t[p + "W_Q"][h]], power))
        sk = ld.const(q + "W_K", lambda: opnorm(B, [t[p + "W_K"][h]], power))
        sov = ld.const(q + "OV", lambda: opnorm(B, [t[p + "W_V"][h], t[p + "W_O"][h]], power))
        bvo = ld.const(q + "b_VO", lambda: row_norm(B, t[p + "b_V"][h], t[p + "W_O"][h]))
        qb = ld.const(q + "query", lambda: sq * U + vec_norm(B, t[p + "b_Q"][h]))
        kb = ld.const(q + "key", lambda: sk * U + vec_norm(B, t[p + "b_K"][h]))
        qk, bq_bk, ka_, kk_ = qb * kb, None, sq * kb, qb * sk   # norm-product forms (any positions)
        if not cfg.rotary:  # scores are bilinear in (u, u') through W_Q W_K^T: often much smaller
            sqk = ld.const(q + "QK", lambda: opnorm(B, [t[p + "W_Q"][h], t[p + "W_K"][h].T], power))
            alpha = ld.const(q + "W_K.b_Q", lambda: row_norm(B, t[p + "b_Q"][h], t[p + "W_K"][h].T))
            beta = ld.const(q + "W_Q.b_K", lambda: row_norm(B, t[p + "b_K"][h], t[p + "W_Q"][h].T))
            bq_bk = B.abs_upper(B.dot(W_vec(B, t[p + "b_Q"][h]), W_vec(B, t[p + "b_K"][h])))
            qk = min(qk, sqk * U * U + (alpha + beta) * U + bq_bk)
            ka_, kk_ = min(ka_, sqk * U + beta), min(kk_, sqk * U + alpha)
        A = ld.const(q + "A", lambda: qk / div)
        kappa = ld.const(q + "kappa", lambda: B.upper(
            n_max / (1 + (n_max - 1) * B.exp(B.num(-2 * A)))))
        ka = ld.const(q + "K_query", lambda: lam * ka_ / div)
        kk = ld.const(q + "K_key", lambda: lam * kk_ / div)
        vo = sov * U                                   # values lie within vo of their centre b_V W_O
        out_norm += sov * U + bvo
        S = kappa * (D + E) if causal else kappa * D + E   # n * (attention-weighted input change)
        d_att += 2 * vo
        # the head output moves by <= 2 vo at any query, and ||a - a'||_1 <= 2; both are <= (.) cap rho(m)
        e_att += min(2 * vo * cap, sov * lam * S + 2 * vo * min(cap, ka * E + kk * S))
    out_norm = ld.const(f"L{layer}.attn.out", lambda: out_norm)
    d_att = ld.const(f"L{layer}.attn.D", lambda: d_att)
    e_att = ld.const(f"L{layer}.attn.E", lambda: e_att)
    return out_norm, d_att, e_att


def W_vec(B, v) -> list:
    """A stored vector as a list of exact interval scalars."""
    return B.array(v).rows()[0]


def row_norm(B, v, M) -> Fraction:
    """Upper bound of ||v M||_2 for a stored vector v and matrix M."""
    r = B.array(v) @ B.array(M)
    return B.upper(B.sqrt((r @ r.T).rows()[0][0]))


def mlp_layer(B, ld, model, layer, U, lam, power):
    """(output-norm bound, radius about b_out, Lipschitz constant) of block `layer`'s MLP."""
    t, p, q = model.tensors, f"blocks.{layer}.mlp.", f"L{layer}.mlp."
    s_in = ld.const(q + "W_in", lambda: opnorm(B, [t[p + "W_in"]], power))
    s_out = ld.const(q + "W_out", lambda: opnorm(B, [t[p + "W_out"]], power))
    radius = ld.const(q + "radius", lambda: s_out * (s_in * U + vec_norm(B, t[p + "b_in"])))
    out = ld.const(q + "out", lambda: radius + vec_norm(B, t[p + "b_out"]))
    lip = ld.const(q + "lip", lambda: s_out * act_lipschitz(B, model.config.act_fn) * s_in * lam)
    return out, radius, lip


def derive(model, B, ld, n_max: int, power: int, embed_center, unembed_center, ob):
    """Recompute every constant in dependency order; return the smallest claimable C, C_prob, C_abs,
    C_prob_abs and the final LN's Lipschitz constant lam_f."""
    cfg, t = model.config, model.tensors
    causal = cfg.attention == "causal"
    sqrt_d = up_sqrt(B, Fraction(cfg.d_model))
    with ob.step("embedding: B_0, D_0"):
        memo = {}  # one pass over W_E gives both of its row bounds

        def w_e(j):
            if not memo:
                memo["d"] = max_row_dists(B, t["embed.W_E"], [None, embed_center])
            return memo["d"][j]
        tok = ld.const("embed.token_norm", lambda: w_e(0))
        pos = Fraction(0) if cfg.positional_embedding_type != "standard" else ld.const(
            "embed.pos_norm", lambda: max_row_dist(B, t["pos_embed.W_pos"][:n_max]))
        bound = ld.const("B0", lambda: tok + pos)
        D = ld.const("D0", lambda: 2 * w_e(1))
        E, spread = Fraction(0), Fraction(0)   # spread: how far an unchanged position can move at all
    for layer in range(cfg.n_layers):
        with ob.step(f"block {layer}: B_{layer + 1}, A, K, D_{layer + 1}, E_{layer + 1}"):
            ln1 = f"blocks.{layer}.ln1" if cfg.has_ln else None
            ln2 = (ln1 if cfg.shared_ln else f"blocks.{layer}.ln2") if cfg.has_ln else None
            lam1, U1 = layer_norm(B, ld, model, ln1, f"L{layer}.ln1", bound, cfg.eps, sqrt_d)
            cap = ld.const(f"cap{layer + 1}", lambda: cap_factor(B, n_max, layer + 1, causal))
            a_out, d_att, e_att = attention_layer(B, ld, model, layer, U1, lam1, D, E, n_max, cap, power, causal)
            L = f"L{layer}."
            if cfg.attn_only:
                nb = bound + a_out
                D, E = min(D + d_att, 2 * nb), E + e_att
            elif cfg.parallel_attn_mlp:
                lam2, U2 = (lam1, U1) if ln2 == ln1 else layer_norm(B, ld, model, ln2, f"L{layer}.ln2", bound, cfg.eps, sqrt_d)
                m_out, m_rad, m_lip = mlp_layer(B, ld, model, layer, U2, lam2, power)
                nb = bound + a_out + m_out
                D, E = min(D + d_att + min(m_lip * D, 2 * m_rad), 2 * nb), E + e_att + m_lip * E
            else:
                mid = ld.const(L + "B_mid", lambda: bound + a_out)
                d_mid, e_mid = min(D + d_att, 2 * mid), E + e_att
                lam2, U2 = layer_norm(B, ld, model, ln2, f"L{layer}.ln2", mid, cfg.eps, sqrt_d)
                m_out, m_rad, m_lip = mlp_layer(B, ld, model, layer, U2, lam2, power)
                nb = mid + m_out
                D, E = min(d_mid + min(m_lip * d_mid, 2 * m_rad), 2 * nb), e_mid * (1 + m_lip)
            bound = ld.const(f"B{layer + 1}", lambda: nb)
            D = ld.const(f"D{layer + 1}", lambda d=D: d)
            # a position m != i has the same embedding in both inputs, and each sublayer output lies in a
            # fixed ball (attention: radius d_att/2; MLP: m_rad), so delta_m <= spread <= spread cap rho(m)
            spread = ld.const(f"spread{layer + 1}", lambda: spread + d_att + (0 if cfg.attn_only else 2 * m_rad))
            E = ld.const(f"E{layer + 1}", lambda e=E: min(e, spread * cap))
    with ob.step("unembedding: final LN, radius of W_U columns"):
        lam_f = Fraction(1)
        if cfg.final_ln:
            lam_f = ld.const("ln_final.lip", lambda: B.upper(B.num(max_abs(B, t["ln_final.w"])) /
                                                            B.sqrt(B.num(cfg.eps))))
        r_u = ld.const("unembed.radius", lambda: max_row_dist(B, np.asarray(t["unembed.W_U"]).T, unembed_center))
    # ||p - p'||_1 <= 2 <= 2 cap_L r(n); the n-independent caps: the last position moves by <= spread_L
    return {"C": E, "C_prob": min(r_u * lam_f * E, 2 * cap), "C_abs": spread,
            "C_prob_abs": min(r_u * lam_f * spread, 2), "lam_f": lam_f}


# --- parsing and the corollary -----------------------------------------------------------------

def parse(model, claim, evidence):
    """Validate claim and evidence shapes; return the parsed pieces."""
    cfg = model.config
    fields(claim, "claim", {"n_min", "n_max", "rate", "C", "C_prob", "C_abs", "C_prob_abs"}, {"corollary"})
    fields(evidence, "evidence", {"power", "embed_center", "unembed_center", "constants"})
    n_min = parse_int(claim["n_min"], "claim.n_min", 2, cfg.n_ctx)
    n_max = parse_int(claim["n_max"], "claim.n_max", n_min, cfg.n_ctx)
    if claim["rate"] not in ("inverse", "harmonic"):
        raise BadInput("claim.rate: must be \"inverse\" or \"harmonic\"")
    if claim["rate"] == "inverse" and cfg.attention == "causal" and cfg.n_layers > 1:
        raise BadInput("claim.rate: a causal model with >= 2 layers is certified at the harmonic rate "
                       "H_n^(L-1)/n, not 1/n (docs/influence.md)")
    bounds = {k: parse_number(claim[k], f"claim.{k}") for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    power = parse_int(evidence["power"], "evidence.power", 0, MAX_POWER)
    centers = [parse_vector(evidence[key], f"evidence.{key}", cfg.d_model, "d_model")
               for key in ("embed_center", "unembed_center")]
    consts = evidence["constants"]
    if not isinstance(consts, dict) or len(consts) > 100_000:
        raise BadInput("evidence.constants: must be an object of named numbers")
    consts = {str(k): parse_number(v, f"evidence.constants.{k[:40]}") for k, v in consts.items()}
    return n_min, n_max, claim["rate"], bounds, power, centers, consts


def check_corollary(model, B, ob, cor, n_min, n_max, rate_name, bounds, lam_f) -> str:
    """The multi-layer overwhelm-type guarantee on one input; returns the summary sentence."""
    cfg, t = model.config, model.tensors
    fields(cor, "claim.corollary", {"prediction", "substitutions", "gap_lipschitz"})
    tokens, k, margin = parse_prediction(cor["prediction"], cfg, "claim.corollary.prediction")
    n = len(tokens)
    if not n_min <= n <= n_max:
        raise BadInput(f"claim.corollary: input length {n} outside [n_min, n_max] = [{n_min}, {n_max}]")
    R = parse_int(cor["substitutions"], "claim.corollary.substitutions", 1, n - 1)
    G = parse_number(cor["gap_lipschitz"], "claim.corollary.gap_lipschitz")
    check_prediction(B, model, cor["prediction"], ob, "claim.corollary.prediction")
    with ob.step("corollary: max_j ||W_U[:,k] - W_U[:,j]||"):
        W_U = np.asarray(t["unembed.W_U"])
        need = max_row_dist(B, W_U.T, [Fraction(float(x)) for x in W_U[:, k]])
        ob.require(G >= need, "corollary: gap_lipschitz", f"claimed {show(G)} is below {show(need)}")
    one = min(bounds["C"] * rate(rate_name, n, cfg.n_layers), bounds["C_abs"])
    move = R * G * lam_f * one
    ob.require(move < margin, "corollary: R changes cannot close the gap",
               f"R*G*lip*min(C r(n), C_abs) = {show(move)} is not < margin {show(margin)}")
    return (f"; on input of length {n} the next token {k} (margin {show(margin)}) survives ANY change of "
            f"<= {R} non-final tokens (total logit-gap movement <= {show(move)})")


def check(model, claim, evidence, B, ob):
    """Verify an influence certificate (and its corollary, when present)."""
    cfg = model.config
    n_min, n_max, rate_name, bounds, power, centers, consts = parse(model, claim, evidence)
    ld = Ledger(consts, ob)
    need = derive(model, B, ld, n_max, power, centers[0], centers[1], ob)
    unused = sorted(set(consts) - ld.used)
    if unused:
        raise BadInput(f"evidence.constants: unused name(s) {unused[:4]}")
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):
        ob.require(bounds[key] >= need[key], f"claim {key}",
                   f"claimed {key} = {show(bounds[key])} is below the recomputed {show(need[key])}")
    r = "1/n" if rate_name == "inverse" else f"H_n^{cfg.n_layers - 1}/n"
    ob.summary = (f"for n in [{n_min}, {n_max}] ({cfg.attention} attention, {cfg.n_layers} layer(s)), one changed "
                  f"non-final token moves the last residual by <= min({show(bounds['C'])}*{r}, "
                  f"{show(bounds['C_abs'])}) and the output distribution (L1) by <= "
                  f"min({show(bounds['C_prob'])}*{r}, {show(bounds['C_prob_abs'])})")
    if "corollary" in claim:
        ob.summary += check_corollary(model, B, ob, claim["corollary"], n_min, n_max, rate_name, bounds,
                                      need["lam_f"])
