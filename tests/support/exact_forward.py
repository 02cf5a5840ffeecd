"""An independent high-precision forward pass: the next-token logits of model-format.md section 4 in mpmath
point arithmetic (a private context, 300 bits by default), written from the document, not from the checker.

At 300 bits its own rounding is ~2^-290 relative, far below any enclosure width the checker produces, so
tests compare the checker's enclosures with these values as if they were exact (with a tolerance of
TOLERANCE relative to the logit scale to be honest about the reference's own rounding).
"""

from fractions import Fraction

import numpy as np
from mpmath.ctx_mp import MPContext

TOLERANCE = Fraction(1, 2 ** 240)


class ExactForward:
    """model-format.md section 4 on one token sequence, in mpf at `prec` bits."""

    def __init__(self, model, prec: int = 300):
        self.c, self.mp = model.config, MPContext()
        self.mp.prec = prec
        mpf = self.mp.mpf
        self.t = {k: np.vectorize(lambda x: mpf(float(x)), otypes=[object])(np.asarray(v, dtype=np.float64))
                  for k, v in model.tensors.items()}

    def num(self, x: Fraction):
        """An exact config number (eps, rotary_base, attn_scale) as an mpf."""
        return self.mp.mpf(x.numerator) / x.denominator

    def ln(self, x, name):
        """LayerNorm of one row (list of mpf) with gain/bias `name`.w/.b (identity without LN)."""
        if name is None:
            return x
        mp, d = self.mp, len(x)
        if self.c.normalization_type == "RMS":   # x / sqrt(mean(x^2) + eps) * w, no centring, no bias
            s = mp.sqrt(mp.fsum(a * a for a in x) / d + self.num(self.c.eps))
            return [a / s * self.t[name + ".w"][i] for i, a in enumerate(x)]
        mean = mp.fsum(x) / d
        c = [a - mean for a in x]
        s = mp.sqrt(mp.fsum(a * a for a in c) / d + self.num(self.c.eps))
        w, b = self.t[name + ".w"], self.t[name + ".b"]
        return [a / s * w[i] + b[i] for i, a in enumerate(c)]

    def act(self, x):
        mp = self.mp
        if self.c.act_fn == "relu":
            return x if x > 0 else mp.mpf(0)
        if self.c.act_fn == "gelu":
            return x * (1 + mp.erf(x / mp.sqrt(2))) / 2
        if self.c.act_fn == "silu":
            return x / (1 + mp.exp(-x))
        return x * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (x + mp.mpf(44715) / 10 ** 6 * x ** 3))) / 2

    def matvec(self, x, W):
        """x @ W for a row x (list of mpf) and a matrix W (object array)."""
        return [self.mp.fsum(x[i] * W[i][j] for i in range(len(x))) for j in range(W.shape[1])]

    def rotate(self, v, pos):
        c, mp = self.c, self.mp
        if not c.rotary:
            return v
        half, out = c.rotary_dim // 2, list(v)
        pairs = [(2 * j, 2 * j + 1) for j in range(half)] if c.rotary_adjacent_pairs else \
            [(j, j + half) for j in range(half)]
        for j, (i1, i2) in enumerate(pairs):
            a = pos / self.num(c.rotary_scaling_factor) * mp.power(self.num(c.rotary_base), mp.mpf(-2 * j) / c.rotary_dim)
            out[i1] = v[i1] * mp.cos(a) - v[i2] * mp.sin(a)
            out[i2] = v[i2] * mp.cos(a) + v[i1] * mp.sin(a)
        return out

    def attention(self, A, layer):
        """Attention output rows of block `layer` for normalised rows A."""
        c, mp, p = self.c, self.mp, f"blocks.{layer}.attn."
        n = len(A)
        div = mp.sqrt(c.d_head) if c.attn_scale is None else self.num(c.attn_scale)
        out = [[mp.mpf(0)] * c.d_model for _ in range(n)]
        for h in range(c.n_heads):
            g = h if c.n_key_value_heads is None else h // (c.n_heads // c.n_key_value_heads)
            pre = "" if c.n_key_value_heads is None else "_"      # grouped keys/values: _W_K, _b_K, ...
            names = {"Q": ("W_Q", "b_Q", h), "K": (pre + "W_K", pre + "b_K", g), "V": (pre + "W_V", pre + "b_V", g)}
            proj = {m: [[a + b for a, b in zip(self.matvec(A[r], self.t[p + w][i]), self.t[p + b][i])]
                        for r in range(n)] for m, (w, b, i) in names.items()}
            q = [self.rotate(proj["Q"][r], r) for r in range(n)]
            k = [self.rotate(proj["K"][r], r) for r in range(n)]
            for i in range(n):
                keys = range(i + 1) if c.attention_dir == "causal" else range(n)
                s = [mp.fsum(a * b for a, b in zip(q[i], k[r])) / div for r in keys]
                top = max(s)
                e = [mp.exp(x - top) for x in s]
                total = mp.fsum(e)
                z = [mp.fsum(e[j] / total * proj["V"][r][t] for j, r in enumerate(keys)) for t in range(c.d_head)]
                out[i] = [a + b for a, b in zip(out[i], self.matvec(z, self.t[p + "W_O"][h]))]
        return [[a + b for a, b in zip(row, self.t[p + "b_O"])] for row in out]

    def mlp(self, M, layer):
        p = f"blocks.{layer}.mlp."
        rows = []
        for x in M:
            if self.c.gated_mlp:   # act(x W_gate) * (x W_in) + b_in
                gate = self.matvec(x, self.t[p + "W_gate"])
                hid = [self.act(a) * u + b for a, u, b in zip(gate, self.matvec(x, self.t[p + "W_in"]), self.t[p + "b_in"])]
            else:
                hid = [self.act(a + b) for a, b in zip(self.matvec(x, self.t[p + "W_in"]), self.t[p + "b_in"])]
            rows.append([a + b for a, b in zip(self.matvec(hid, self.t[p + "W_out"]),
                                               self.t[p + "b_out"])])
        return rows

    def logits(self, tokens: list) -> list:
        """The last position's logits (list of mpf)."""
        c = self.c
        X = [list(self.t["embed.W_E"][x]) for x in tokens]
        if c.positional_embedding_type == "standard":
            X = [[a + b for a, b in zip(row, self.t["pos_embed.W_pos"][p])] for p, row in enumerate(X)]
        for layer in range(c.n_layers):
            ln1 = f"blocks.{layer}.ln1" if c.has_norm else None
            ln2 = (ln1 if c.shared_ln else f"blocks.{layer}.ln2") if c.has_norm else None
            att = self.attention([self.ln(x, ln1) for x in X], layer)
            if c.attn_only:
                X = [[a + b for a, b in zip(x, y)] for x, y in zip(X, att)]
            elif c.parallel_attn_mlp:
                m = self.mlp([self.ln(x, ln2) for x in X], layer)
                X = [[a + b + d for a, b, d in zip(x, y, z)] for x, y, z in zip(X, att, m)]
            else:
                mid = [[a + b for a, b in zip(x, y)] for x, y in zip(X, att)]
                m = self.mlp([self.ln(x, ln2) for x in mid], layer)
                X = [[a + b for a, b in zip(x, y)] for x, y in zip(mid, m)]
        y = self.ln(X[-1], "ln_final") if c.final_ln else X[-1]
        return [a + b for a, b in zip(self.matvec(y, self.t["unembed.W_U"]), self.t["unembed.b_U"])]


def to_fraction(x) -> Fraction:
    """An mpf as the exact Fraction it holds (finite; _mpf_ = (sign, mantissa, exponent, bit count))."""
    sign, man, exp, _ = x._mpf_
    return (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)
