"""The selftest's oracle: the model-format semantics (docs/model-format.md section 4) in mpmath at high
precision, written from the document and sharing no code with the checker (nothing from tcert.checker's
forward pass, interval backends or kinds: the point of `tcert selftest` is to catch the checker being wrong).

Every stored weight is a binary rational that an mpf of >= 53 bits holds exactly, so the only error is
mpmath's rounding at `prec` bits (200 by default): far below the margins a decision needs. Decisions are
three-valued: True, False, or None when a quantity is within `tolerance` of its threshold.

Covers what the selftest's random models use: learned, rotary or no positions; LayerNorm (ln1/ln2, shared
ln1, final LN) or none; relu, gelu, gelu_new; sequential or parallel MLP or attention-only; causal or
bidirectional attention; any attention scale. Not RMSNorm, gated MLPs or grouped-query attention.
"""

import itertools

from mpmath.ctx_mp import MPContext


class ExactModel:
    """Last-position residual, logits and next-token distribution of one model, at `prec` bits."""

    def __init__(self, model, prec: int = 200):
        c = self.c = model.config
        unsupported = [name for name, on in (("RMSNorm", c.normalization_type == "RMS"), ("gated MLP", c.gated_mlp),
                                             ("grouped-query attention", c.n_key_value_heads), ("silu", c.act_fn == "silu"
                                              and not c.attn_only)) if on]
        if unsupported:
            raise ValueError(f"the selftest oracle does not cover {', '.join(unsupported)}")
        self.mp = MPContext()   # a private context: the global mpmath precision is left alone
        self.mp.prec = prec
        self.tolerance = self.mp.mpf(2) ** (40 - prec)
        mpf = self.mp.mpf
        self.W = {k: _mp_array(v, mpf) for k, v in model.tensors.items()}
        self.scale = (mpf(1) if not c.use_attn_scale else
                      self.mp.sqrt(c.d_head) if c.attn_scale is None else self.exact(c.attn_scale))

    def exact(self, q):
        """An exact config number (a Fraction) as an mpf."""
        return self.mp.mpf(q.numerator) / q.denominator

    # --- section 4 -------------------------------------------------------------------------------

    def norm(self, x, name):
        """LayerNorm of the row `x` with `name`.w / `name`.b (identity for normalization_type null)."""
        if self.c.normalization_type is None:
            return x
        mp, d = self.mp, len(x)
        mean = mp.fsum(x) / d
        cx = [a - mean for a in x]
        s = mp.sqrt(mp.fsum(a * a for a in cx) / d + self.exact(self.c.eps))
        w, b = self.W[name + ".w"], self.W[name + ".b"]
        return [a / s * w[i] + b[i] for i, a in enumerate(cx)]

    def rotate(self, v, pos):
        c, mp = self.c, self.mp
        if c.positional_embedding_type != "rotary":
            return v
        R, out = c.rotary_dim, list(v)
        for j in range(R // 2):
            theta = mp.power(self.exact(c.rotary_base), mp.mpf(-2 * j) / R) / self.exact(c.rotary_scaling_factor)
            i1, i2 = (2 * j, 2 * j + 1) if c.rotary_adjacent_pairs else (j, j + R // 2)
            cs, sn = mp.cos(pos * theta), mp.sin(pos * theta)
            out[i1], out[i2] = v[i1] * cs - v[i2] * sn, v[i2] * cs + v[i1] * sn
        return out

    def affine(self, x, W, b):
        """x @ W + b for a row x, W a list of rows."""
        return [self.mp.fdot(x, col) + b[j] for j, col in enumerate(zip(*W))]

    def attention(self, A, i, rows):
        """Attention_i(A) at the query positions `rows` (every key and value is still read)."""
        c, mp, W = self.c, self.mp, self.W
        n, p_ = len(A), f"blocks.{i}.attn."
        out = {p: list(W[p_ + "b_O"]) for p in rows}
        for h in range(c.n_heads):
            q = {p: self.rotate(self.affine(A[p], W[p_ + "W_Q"][h], W[p_ + "b_Q"][h]), p) for p in rows}
            k = [self.rotate(self.affine(a, W[p_ + "W_K"][h], W[p_ + "b_K"][h]), p) for p, a in enumerate(A)]
            v = [self.affine(a, W[p_ + "W_V"][h], W[p_ + "b_V"][h]) for a in A]
            for p in rows:
                visible = range(p + 1) if c.attention_dir == "causal" else range(n)
                s = [mp.fdot(q[p], k[r]) / self.scale for r in visible]
                top = max(s)
                e = [mp.exp(x - top) for x in s]
                z = mp.fsum(e)
                mixed = [mp.fsum(e[j] * v[r][d] for j, r in enumerate(visible)) / z for d in range(c.d_head)]
                contrib = self.affine(mixed, W[p_ + "W_O"][h], [0] * c.d_model)
                out[p] = [a + b for a, b in zip(out[p], contrib)]
        return [out[p] for p in rows]

    def act(self, u):
        mp, f = self.mp, self.c.act_fn
        if f == "relu":
            return max(u, mp.mpf(0))
        if f == "gelu":
            return u * (1 + mp.erf(u / mp.sqrt(2))) / 2
        return u * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (u + mp.mpf(44715) / 10 ** 6 * u ** 3))) / 2

    def mlp(self, x, i):
        W, p_ = self.W, f"blocks.{i}.mlp."
        hidden = [self.act(u) for u in self.affine(x, W[p_ + "W_in"], W[p_ + "b_in"])]
        return self.affine(hidden, W[p_ + "W_out"], W[p_ + "b_out"])

    def residual(self, tokens) -> list:
        """The residual stream at the last position after the last block (before any final LN)."""
        c, W = self.c, self.W
        X = [list(W["embed.W_E"][t]) for t in tokens]
        if c.positional_embedding_type == "standard":
            X = [[a + b for a, b in zip(x, W["pos_embed.W_pos"][p])] for p, x in enumerate(X)]
        for i in range(c.n_layers):
            # the last block needs only the last row (every row still feeds its keys and values)
            rows = [len(X) - 1] if i == c.n_layers - 1 else list(range(len(X)))
            A = [self.norm(x, f"blocks.{i}.ln1") for x in X]
            att = self.attention(A, i, rows)
            X, A = [X[p] for p in rows], [A[p] for p in rows]
            if c.attn_only:
                X = [[a + b for a, b in zip(x, y)] for x, y in zip(X, att)]
                continue
            if c.parallel_attn_mlp:
                M = A if c.shared_ln else [self.norm(x, f"blocks.{i}.ln2") for x in X]
                X = [[a + b + m for a, b, m in zip(x, y, self.mlp(mm, i))] for x, y, mm in zip(X, att, M)]
            else:
                X = [[a + b for a, b in zip(x, y)] for x, y in zip(X, att)]
                X = [[a + m for a, m in zip(x, self.mlp(self.norm(x, f"blocks.{i}.ln2"), i))] for x in X]
        return X[-1]

    def logits(self, tokens) -> list:
        y = self.residual(tokens)
        if self.c.final_ln:
            y = self.norm(y, "ln_final")
        return self.affine(y, self.W["unembed.W_U"], self.W["unembed.b_U"])

    def probabilities(self, logits) -> list:
        top = max(logits)
        e = [self.mp.exp(x - top) for x in logits]
        z = self.mp.fsum(e)
        return [x / z for x in e]

    # --- decisions -------------------------------------------------------------------------------

    def at_least(self, x, bound):
        """x >= bound: True, False, or None within the tolerance (relative to the sizes involved)."""
        slack = self.tolerance * (1 + abs(x) + abs(bound))
        return True if x >= bound + slack else False if x < bound - slack else None

    def ahead_by(self, tokens, k: int, margin) -> bool | None:
        """Whether logit k beats every other logit on `tokens` by at least `margin` (a Fraction or mpf)."""
        lg = self.logits(tokens)
        m = margin if not hasattr(margin, "numerator") else self.exact(margin)
        return all3(self.at_least(lg[k] - lg[j], m) for j in range(len(lg)) if j != k)

    def strict_argmax(self, tokens, k: int) -> bool | None:
        """Whether token k has the strictly largest logit on `tokens`."""
        lg = self.logits(tokens)
        return all3(self.at_least(lg[k] - lg[j], 0) if lg[k] != lg[j] else False for j in range(len(lg)) if j != k)


def all3(values) -> bool | None:
    """Three-valued AND: False if any is False, else None if any is None, else True."""
    out = True
    for v in values:
        if v is False:
            return False
        if v is None:
            out = None
    return out


def _mp_array(a, mpf):
    """A numpy array as nested lists of mpf (exact: every stored value is a binary rational)."""
    if a.ndim == 0:
        return mpf(float(a))
    if a.ndim == 1:
        return [mpf(float(x)) for x in a]
    return [_mp_array(x, mpf) for x in a]


def distinct_permutations(tokens) -> list:
    """Every distinct ordering of a multiset."""
    return sorted(set(itertools.permutations(tokens)))
