"""Float64 views of the overwhelm argument shared by every generator method: the model's tensors, the
fixed side and the free tables (scores, centred values) that `tcert.checker.kinds.overwhelm.tables`
encloses rigorously, and rounding to doubles."""

import math
from fractions import Fraction

import numpy as np


def round_down(q) -> float:
    """The largest double <= q (q a Fraction)."""
    f = float(q)
    return math.nextafter(f, -math.inf) if Fraction(f) > q else f


def round_up(q) -> float:
    """The smallest double >= q."""
    f = float(q)
    return math.nextafter(f, math.inf) if Fraction(f) < q else f


class FloatModel:
    """Float64 views of the tensors the bound needs."""

    def __init__(self, model):
        c = self.c = model.config
        t = model.tensors
        self.memo = {}
        f = lambda name: np.asarray(t[name], dtype=np.float64)
        self.E, self.WU = f("embed.W_E"), f("unembed.W_U")
        p = "blocks.0.attn."
        self.WQ, self.WK, self.WV, self.WO = f(p + "W_Q"), f(p + "W_K"), f(p + "W_V"), f(p + "W_O")
        self.bQ, self.bK = f(p + "b_Q"), f(p + "b_K")
        self.lnw = f("blocks.0.ln1.w") if c.has_ln else None
        self.lnb = f("blocks.0.ln1.b") if c.has_ln else None
        self.div = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
        rd = c.rotary_dim if c.rotary else 0   # positional type "none": no pairs, rotate is the identity
        self.theta = float(c.rotary_base) ** (-2.0 * np.arange(rd // 2) / rd)
        half = rd // 2
        if c.rotary_adjacent_pairs:
            self.i1, self.i2 = np.arange(0, rd, 2), np.arange(1, rd, 2)
        else:
            self.i1, self.i2 = np.arange(half), np.arange(half, rd)

    def ln(self, tokens):
        """LayerNorm'd embedding rows (identity without LN)."""
        x = self.E[tokens]
        if self.lnw is None:
            return x
        xc = x - x.mean(axis=1, keepdims=True)
        return xc / np.sqrt((xc * xc).mean(axis=1, keepdims=True) + float(self.c.eps)) * self.lnw + self.lnb

    def rotate(self, q, offsets):
        """q (heads, d_head) rotated by each offset: (len(offsets), heads, d_head)."""
        ang = np.asarray(offsets, dtype=np.float64)[:, None] * self.theta[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = q[None, :, self.i1], q[None, :, self.i2]
        out = np.repeat(q[None], len(offsets), axis=0)
        out[:, :, self.i1] = x1 * cos - x2 * sin
        out[:, :, self.i2] = x2 * cos + x1 * sin
        return out


def float_fixed(fm: FloatModel, prefix, query, n_free, log_mass: bool = False):
    """(q (heads, d_head), and per head lq, alpha_fix, u): the fixed side with the query at n_fix + n_free.
    u is computed relative to the largest fixed score, so it stays finite when alpha_fix = sum exp(l - lq)
    overflows (inf); log_mass=True returns log(alpha_fix) (always finite) in its place."""
    n_fix, q_pos = len(prefix), len(prefix) + n_free
    Xq = fm.ln([query])[0]
    q = np.einsum("d,hde->he", Xq, fm.WQ) + fm.bQ                      # (H, dh)
    fixed_tokens = list(prefix) + [query]
    Xf = fm.ln(fixed_tokens)
    Kf = np.einsum("nd,hde->nhe", Xf, fm.WK) + fm.bK                   # (n_fix+1, H, dh)
    Vf = np.einsum("nd,hde->nhe", Xf, fm.WV)
    qrot_fix = fm.rotate(q, [q_pos - p for p in range(n_fix)] + [0]) / fm.div
    lfix = np.einsum("nhe,nhe->hn", qrot_fix, Kf)                    # (H, n_fix+1), last = query
    lq = lfix[:, -1]
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(lfix - lq[:, None])
        alpha_fix = w.sum(axis=1)
        u = np.einsum("hn,nhe->he", w, Vf) / alpha_fix[:, None]
    log_alpha = np.log(alpha_fix)
    if not np.isfinite(u).all():   # a fixed score beyond lq + 709: the same relative to the largest one
        top = lfix.max(axis=1)
        w = np.exp(lfix - top[:, None])
        mass = w.sum(axis=1)
        u, log_alpha = np.einsum("hn,nhe->he", w, Vf) / mass[:, None], np.log(mass) + (top - lq)
        with np.errstate(over="ignore"):
            alpha_fix = np.exp(log_alpha)
    return q, lq, (log_alpha if log_mass else alpha_fix), u


def float_tables(fm: FloatModel, prefix, query, allowed, n_free):
    """Per head: lq, alpha_fix (inf where it overflows), log_alpha_fix, u (head space), values (allowed x
    d_head), free scores (allowed x n_free)."""
    q, lq, log_alpha, u = float_fixed(fm, prefix, query, n_free, log_mass=True)
    with np.errstate(over="ignore"):
        alpha_fix = np.exp(log_alpha)
    Xa = fm.ln(allowed)
    qrot_free = fm.rotate(q, [n_free - c for c in range(n_free)]) / fm.div   # (n_free, H, dh)
    wcols = np.einsum("hde,che->hdc", fm.WK, qrot_free)              # (H, d_model, n_free)
    consts = np.einsum("he,che->hc", fm.bK, qrot_free)
    S = np.einsum("nd,hdc->hnc", Xa, wcols) + consts[:, None, :]     # (H, allowed, n_free)
    values = np.einsum("nd,hde->hne", Xa, fm.WV) - u[:, None, :]
    return dict(lq=lq, alpha_fix=alpha_fix, log_alpha_fix=log_alpha, u=u, values=values, S=S)
