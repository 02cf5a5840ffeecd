"""The model's forward pass, rigorously: enclosures of the exact real-number logits.

Semantics (docs/model-format.md): pre-LN blocks, LayerNorm or RMSNorm with exact eps, multi-head attention
(optionally grouped-query) with optional rotary embeddings (optionally linearly scaled) and causal mask,
ReLU/GELU/SiLU MLP (optionally gated), optional parallel residual, shared LN and final LN. This module
holds the architecture -- which step follows which (`block`, `attention_output`, `mlp_output`,
`final_state`, `last_logits`); `tcert.checker.error_balls` holds the steps and their error bounds: every
activation row travels as an exact centre plus an l2 error radius (docs/soundness.md, "The forward
pass's error model"). Rows that later layers do not need are not computed (only the last query row of
the last block matters for next-token logits).

Also here, for the overwhelm and accuracy kinds: per-coordinate interval versions of LayerNorm, the MLP
and rotary embeddings (`layer_norm`, `mlp`, `rotate`, ...), which they apply to their own enclosures.
"""

import math
from fractions import Fraction

import numpy as np

from tcert.checker import operator_norms
from tcert.checker.error_balls import (Rows, add, enclosures, exact_affine, exact_normalise, exact_rows, fine_heads, gated, head_output, head_outputs,
                                       heads_output, linear, linear_heads, nonlinear, normalise, rotate_rows, rotation, rotation_cuts, rotation_rows,
                                       exact_rotate, softmax, stack, take)
from tcert.checker.interval import EXACT_MAX_PREC, Backend, IMat, make_backend
from tcert.checker.modelfile import kv_names

__all__ = ["Weights", "last_logits", "unembed_input", "final_residual", "final_state", "softmax", "attn_divisor", "layer_norm",
           "layer_norm_row", "mlp", "rotary_angles", "rotary_pairs", "rotate", "activation", "act_lipschitz"]

GELU_NEW_CUBIC = Fraction(44715, 1000000)


class Weights:
    """Exact interval copies of a model's tensors, converted once per check, and rigorous norms of them.

    `norms` (exact Fractions, independent of the backend and its precision) may be shared between the
    Weights of several backends on one model, e.g. when the prediction kind raises its precision; spectral
    norms are keyed by `squarings` (the trace-power chain's length, `operator_norms.operator_norm`), so a
    looser tier (the prediction kind's coarse pass) never reuses or supplies another tier's bound."""

    def __init__(self, backend: Backend, model, norms: dict | None = None, squarings: int = operator_norms.SQUARINGS):
        self.B, self.model, self.cache = backend, model, {}
        self.norms = {} if norms is None else norms
        self.squarings = squarings

    def _cached(self, key, make):
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def release(self, prefix: str) -> None:
        """Drop the cached interval copies of the tensors named `prefix`... (their norms stay): a deep
        model's pass needs one block's weights at a time, and Arb copies of all of them at once would take
        ~48 bytes per weight (4 GB at 12 layers of GPT-2-small width)."""
        for key in [k for k in self.cache if k[0].startswith(prefix)]:
            del self.cache[key]

    def mat(self, name: str, head: int | None = None) -> IMat:
        """Tensor `name` (or its slice for `head`) as an interval matrix; vectors become rows."""
        t = self.model.tensors[name]
        return self._cached((name, head), lambda: self.B.array(t if head is None else t[head]))

    def heads_concat(self, name: str) -> IMat:
        """W_Q/W_K/W_V of all heads side by side: (d_model, n_heads * d_head)."""
        t = self.model.tensors[name]
        return self._cached((name, "concat"), lambda: self.B.array(np.concatenate(list(t), axis=1)))

    def heads_stacked(self, name: str) -> IMat:
        """W_O of all heads stacked: (n_heads * d_head, d_model)."""
        t = self.model.tensors[name]
        return self._cached((name, "stacked"), lambda: self.B.array(np.concatenate(list(t), axis=0)))

    def affine(self, name: str, bias: str, concat: bool = False) -> IMat:
        """[W; b] as one point matrix: tensor `name` (per-head tensors side by side with `concat`) with the
        bias `bias` as its last row, for the exact layer's x W + b (`error_balls.exact_affine`)."""
        def make():
            t = self.model.tensors[name]
            w = np.concatenate(list(t), axis=1) if concat else np.asarray(t)
            b = np.asarray(self.model.tensors[bias]).reshape(1, -1)
            return self.B.array(np.vstack([w.astype(np.float64), b.astype(np.float64)]))
        return self._cached((name, "affine", bias), make)

    def vec(self, name: str, head: int | None = None) -> list:
        """A bias or LN vector as a list of interval scalars."""
        return self.mat(name, head).rows()[0]

    def bias(self, name: str):
        """A bias (per-head biases side by side) as a list of interval scalars, or None when it is all zero."""
        t = np.asarray(self.model.tensors[name]).reshape(-1)
        return self._cached((name, "bias"), lambda: self.B.array(t).rows()[0] if np.any(t != 0) else None)

    def norm(self, name: str, head: int | None = None) -> Fraction:
        """An exact rational >= the spectral norm of a weight matrix: tensor `name`, its slice for `head`,
        or for per-head tensors the heads stacked (W_O) or side by side (W_Q, W_K, W_V)."""
        key = ("norm", name, head, self.squarings)
        if key not in self.norms:
            t = np.asarray(self.model.tensors[name])
            if head is not None:
                t = t[head]
            elif t.ndim == 3:
                t = np.concatenate(list(t), axis=0 if name.endswith("W_O") else 1)
            self.norms[key] = operator_norms.operator_norm(t, self.squarings)
        return self.norms[key]

    def col_norms(self, name: str) -> list:
        """Exact rationals >= the l2 norm of each column of matrix `name`."""
        key = ("columns", name)
        if key not in self.norms:
            self.norms[key] = operator_norms.column_norms(self.model.tensors[name])
        return self.norms[key]

    def max_abs(self, name: str) -> Fraction:
        """max |entry| of tensor `name`, exactly."""
        key = ("max_abs", name)
        if key not in self.norms:
            self.norms[key] = operator_norms.max_abs(self.model.tensors[name])
        return self.norms[key]


def attn_divisor(B: Backend, cfg):
    """The number attention scores are divided by: config attn_scale, default sqrt(d_head)."""
    return B.num(cfg.attn_scale) if cfg.attn_scale is not None else B.sqrt(B.num(cfg.d_head))


# --- per-coordinate interval steps (the overwhelm and accuracy kinds use these) --------------------------

def layer_norm_row(B: Backend, row: list, w: list | None, b: list | None, eps: Fraction) -> list:
    """LayerNorm of one vector: (x - mean) / sqrt(var + eps) * w + b, var the biased variance."""
    d = len(row)
    mean = B.fsum(row) / d
    centered = [x - mean for x in row]
    var = B.fsum(c * c for c in centered) / d
    inv = 1 / B.sqrt(var + B.num(eps))
    if w is None:
        return [c * inv for c in centered]
    return [c * inv * wi + bi for c, wi, bi in zip(centered, w, b)]


def rms_norm_row(B: Backend, row: list, w: list, eps: Fraction) -> list:
    """RMSNorm of one vector: x / sqrt(mean(x^2) + eps) * w (no centring, no bias)."""
    inv = 1 / B.sqrt(B.fsum(x * x for x in row) / len(row) + B.num(eps))
    return [x * inv * wi for x, wi in zip(row, w)]


def norm_row(B: Backend, W: Weights, row: list, prefix: str, eps: Fraction) -> list:
    """The model's normalization (LayerNorm, or RMSNorm when normalization_type says so) of one vector."""
    if W.model.config.has_rms:
        return rms_norm_row(B, row, W.vec(prefix + ".w"), eps)
    return layer_norm_row(B, row, W.vec(prefix + ".w"), W.vec(prefix + ".b"), eps)


def layer_norm(B: Backend, X: IMat, W: Weights, prefix: str | None, eps: Fraction) -> IMat:
    """Row-wise normalization of X with weights `prefix`.w(/.b) (LayerNorm, or RMSNorm when the model says
    so); identity when prefix is None."""
    if prefix is None:
        return X
    return B.matrix([norm_row(B, W, row, prefix, eps) for row in X.rows()])


def rotary_frequencies(B: Backend, cfg) -> list:
    """Enclosures of rotary_base^(-2j/rotary_dim) for each rotated pair j (before linear RoPE scaling)."""
    log_base = B.log(B.num(cfg.rotary_base))
    return [B.exp(B.num(Fraction(-2 * j, cfg.rotary_dim)) * log_base) for j in range(cfg.rotary_dim // 2)]


def rotary_angles(B: Backend, cfg, positions) -> dict:
    """cos/sin enclosures of p * rotary_base^(-2j/rotary_dim) for each position p, pair j."""
    if not cfg.rotary:   # positional_embedding_type "none": no pairs, the rotation is the identity
        return {p: ([], []) for p in positions}
    thetas, out = rotary_frequencies(B, cfg), {}
    for p in positions:   # linear RoPE scaling: position p turns like position p / rotary_scaling_factor
        scaled = B.num(Fraction(p) / cfg.rotary_scaling_factor)
        angles = [scaled * t for t in thetas]
        out[p] = ([B.cos(a) for a in angles], [B.sin(a) for a in angles])
    return out


def rotary_factors(B: Backend, cfg, n: int) -> tuple:
    """(big, small, at): the rotary angles p phi_j of positions p < n by angle addition, phi_j = rotary_base^(-2j /
    rotary_dim) / rotary_scaling_factor (the angles of `rotary_angles`): with L = ceil(sqrt n) and p = a L + b,
    big = (cos, sin) of a L phi_j (a row per a < ceil(n / L), a column per pair j), small = (cos, sin) of b phi_j
    (a row per b < L), matrices of B's enclosures, and at = (p // L, p % L) for p = 0..n-1: 2 (L + n / L) cosines
    and sines per pair instead of 2 n (`error_balls.rotation` adds the angles exactly)."""
    side, out = math.isqrt(max(n - 1, 0)) + 1, []
    phis = [t * B.num(1 / Fraction(cfg.rotary_scaling_factor)) for t in rotary_frequencies(B, cfg)]
    for steps in (range(0, n, side), range(side)):
        angles = [[B.num(t) * phi for phi in phis] for t in steps]
        out.append(tuple(B.matrix([[f(x) for x in row] for row in angles]) for f in (B.cos, B.sin)))
    p = np.arange(n)
    return out[0], out[1], (p // side, p % side)


def rotary_pairs(cfg) -> list:
    """The (i1, i2) component pairs that rotary embeddings rotate together (none without rotary)."""
    if not cfg.rotary:
        return []
    half = cfg.rotary_dim // 2
    if cfg.rotary_adjacent_pairs:
        return [(2 * j, 2 * j + 1) for j in range(half)]
    return [(j, j + half) for j in range(half)]


def rotate(row: list, cos_sin, pairs) -> list:
    """Apply the rotary rotation of one position to a query or key vector (list of intervals)."""
    cos, sin = cos_sin
    out = list(row)
    for j, (i1, i2) in enumerate(pairs):
        x1, x2 = row[i1], row[i2]
        out[i1] = x1 * cos[j] - x2 * sin[j]
        out[i2] = x2 * cos[j] + x1 * sin[j]
    return out


def kv_head(cfg, h: int) -> int:
    """The key/value head query head h reads: h itself, or h // (n_heads / n_key_value_heads) with grouped-query
    attention (TransformerLens and Hugging Face repeat each key/value head for consecutive query heads)."""
    return h if cfg.n_key_value_heads is None else h // (cfg.n_heads // cfg.n_key_value_heads)


def activation(B: Backend, cfg):
    """The MLP nonlinearity as a scalar interval function."""
    if cfg.act_fn == "relu":
        return lambda x: B.interval(0, max(B.upper(x), 0)) if B.lower(x) < 0 else x
    if cfg.act_fn == "gelu":
        root2 = B.sqrt(B.num(2))
        return lambda x: x * (1 + B.erf(x / root2)) / 2
    if cfg.act_fn == "silu":   # x sigmoid(x)
        return lambda x: x / (1 + B.exp(-x))
    c = B.sqrt(B.num(2) / B.pi())
    k = B.num(GELU_NEW_CUBIC)
    return lambda x: x * (1 + B.tanh(c * (x + k * x * x * x))) / 2


def act_lipschitz(B: Backend, act_fn: str) -> Fraction:
    """A Lipschitz constant of the MLP nonlinearity (proofs in docs/influence.md, 'MLP'): relu 1; gelu
    max|gelu'| = gelu'(sqrt 2) = (1 + erf 1)/2 + e^(-1)/sqrt(pi) ~ 1.1289; gelu_new < 3/2; silu 5/4.

    silu. With s = sigmoid(x), silu'(x) = s + x s (1 - s), and x s (1 - s) = u / (2 cosh^2 u) for
    u = x/2; cosh^2 u = 1 + sinh^2 u >= 1 + u^2 >= 2|u|, so |x s (1 - s)| <= 1/4 and, as 0 < s < 1,
    silu' lies in (-1/4, 5/4) (its true maximum is ~1.0998)."""
    if act_fn == "relu":
        return Fraction(1)
    if act_fn == "gelu":
        return B.upper((1 + B.erf(B.num(1))) / 2 + B.exp(B.num(-1)) / B.sqrt(B.pi()))
    if act_fn == "silu":
        return Fraction(5, 4)
    return Fraction(3, 2)


def mlp(B: Backend, W: Weights, cfg, layer: int, X: IMat) -> IMat:
    """MLP output of block `layer` on its normalised input X, entrywise intervals."""
    p = f"blocks.{layer}.mlp."
    n = X.shape[0]
    if cfg.gated_mlp:
        return gated_mlp(B, W, cfg, layer, X)
    pre = X @ W.mat(p + "W_in") + B.matrix([W.vec(p + "b_in")] * n)
    post = pre.map(activation(B, cfg))
    return post @ W.mat(p + "W_out") + B.matrix([W.vec(p + "b_out")] * n)


def gated_mlp(B: Backend, W: Weights, cfg, layer: int, X: IMat) -> IMat:
    """Gated MLP (TransformerLens GatedMLP, Llama's SwiGLU): (act(X W_gate) * (X W_in) + b_in) W_out + b_out, the
    product elementwise; b_in is added after it, as TransformerLens does (no gate bias)."""
    p, act = f"blocks.{layer}.mlp.", activation(B, cfg)
    gate, lin = (X @ W.mat(p + "W_gate")).rows(), (X @ W.mat(p + "W_in")).rows()
    b_in = W.vec(p + "b_in")
    post = B.matrix([[act(g) * u + b for g, u, b in zip(gr, ur, b_in)] for gr, ur in zip(gate, lin)])
    return post @ W.mat(p + "W_out") + B.matrix([W.vec(p + "b_out")] * X.shape[0])


def ln_names(cfg, layer: int):
    """The norm tensor prefixes feeding attention and MLP in block `layer` (None: no normalization)."""
    if not cfg.has_norm:
        return None, None
    ln1 = f"blocks.{layer}.ln1"
    return ln1, (ln1 if cfg.shared_ln else f"blocks.{layer}.ln2")


# --- the rigorous forward pass on error balls ------------------------------------------------------------

def normalised(B: Backend, W: Weights, cfg, X: Rows, prefix: str | None) -> Rows:
    """Rows through the normalization `prefix` (LayerNorm, or RMSNorm when the model says so; identity when
    None)."""
    if prefix is None:
        return X
    w_max, t = W.max_abs(prefix + ".w"), W.model.tensors
    b = None if cfg.has_rms else np.asarray(t[prefix + ".b"], dtype=np.float64).reshape(1, -1)
    fast = exact_normalise(B, X, np.asarray(t[prefix + ".w"], dtype=np.float64).reshape(1, -1), b, cfg.eps, w_max,
                           not cfg.has_rms)
    if fast is not None:
        return fast
    w = W.vec(prefix + ".w")
    if cfg.has_rms:
        return normalise(B, X, w, None, cfg.eps, w_max, centred=False)
    return normalise(B, X, w, W.vec(prefix + ".b"), cfg.eps, w_max)


def attention_output(B: Backend, W: Weights, cfg, layer: int, A: Rows, queries: list, angles,
                     where: list | None = None) -> Rows:
    """Attention output (rows = `queries`) of block `layer` given its normalised input rows A; with
    grouped-query attention query head h reads key/value head kv_head(cfg, h). With `where`, A holds
    distinct rows and position p's row is A's row where[p] (keys and values are projected once per
    distinct row, then spread to the positions before the position-dependent rotation)."""
    p, heads, kv = f"blocks.{layer}.attn.", range(cfg.n_heads), kv_names(cfg)
    kv_heads = range(cfg.n_key_value_heads or cfg.n_heads)
    row = (lambda q: q) if where is None else where.__getitem__

    def project(X, m, b, hs, uniform=False):   # uniform: one radius for all rows (keys, values: head_output)
        norms = [W.norm(p + m, h) for h in hs]
        return (exact_affine(B, X, W.affine(p + m, p + b, True), norms, uniform)
                or linear_heads(B, X, W.heads_concat(p + m), norms, W.bias(p + b)))

    qs = project(take(B, A, [row(q) for q in queries]), "W_Q", "b_Q", heads)
    ks = project(A, kv["W_K"], kv["b_K"], kv_heads, True)
    n = A.centre.shape[0] if where is None else len(where)
    mixed = len(queries) * cfg.d_model <= n * cfg.d_head     # few queries: values after the pattern
    vs = take(B, A, where or range(n)) if mixed else project(A, kv["W_V"], kv["b_V"], kv_heads, True)
    if where is not None:
        ks, vs = [take(B, x, where) for x in ks], vs if mixed else [take(B, x, where) for x in vs]
    if cfg.rotary:
        qs = rotated(B, qs, angles, list(queries))
        ks = rotated(B, ks, angles, list(range(n)), True)
    fine = fine_heads(B)
    with (fine or B).precision():
        div = attn_divisor(fine or B, cfg)
    visible = [q + 1 if cfg.attention_dir == "causal" else n for q in queries]
    if mixed:
        out = head_outputs(B, [qs[h] for h in heads], [ks[kv_head(cfg, h)] for h in heads], vs, div, visible, fine)
        out = mixed_values(B, cfg, out, project(stack(B, out), kv["W_V"], kv["b_V"], kv_heads))
    else:
        out = [head_output(B, qs[h], ks[kv_head(cfg, h)], vs[kv_head(cfg, h)], div, visible, fine) for h in heads]
    return heads_output(B, out, W.heads_stacked(p + "W_O"), W.norm(p + "W_O"), [W.norm(p + "W_O", h) for h in heads],
                        W.bias(p + "b_O"))


def mixed_values(B: Backend, cfg, mixes: list, projected: list) -> list:
    """Head h's output from its mix m_h = sum_r a_r A_r of the normalised rows A_r (`head_output` with the
    rows A as its values: a convex combination of error balls like any other), given every mix through every
    key/value head's value map (`projected[g]`: the rows of all mixes stacked, through W_V,g and b_V,g).

    Why. With v_r = A_r W_V + b_V and sum_r a_r = 1 (a softmax), sum_r a_r v_r = (sum_r a_r A_r) W_V + b_V
    exactly: the pattern may multiply the normalised rows first. The value map is then a `linear` step on one
    ball per query row (radius ||W_V,g||_2 e_m plus rounding), instead of a product for every position; the
    softmax bounds read the rows A (max ||A^_r||, their spread) instead of the values."""
    q = mixes[0].centre.shape[0]
    return [take(B, projected[kv_head(cfg, h)], range(h * q, (h + 1) * q)) for h in range(len(mixes))]


class Rotary:
    """The rotary rotations of positions 0..n-1, each made on first use: `angles()`, cos/sin enclosures at
    the backend's precision (`rotary_angles`: the entry-by-entry rotation), and `exact()`, the exact
    layer's `Rotation` from enclosures at twice the precision (their widths then add nothing that
    matters), or None where the layer does not apply."""

    def __init__(self, B: Backend, cfg, n: int):
        self.B, self.cfg, self.n, self._angles, self._exact = B, cfg, n, None, False

    def angles(self) -> dict:
        if self._angles is None:
            self._angles = rotary_angles(self.B, self.cfg, range(self.n))
        return self._angles

    def exact(self):
        if self._exact is False:
            self._exact = None
            if self.B.exact and self.B.prec <= EXACT_MAX_PREC:
                fine = make_backend(self.B.name, 2 * self.B.prec)
                with fine.precision():
                    self._exact = rotation(fine, *rotary_factors(fine, self.cfg, self.n), rotary_pairs(self.cfg),
                                           self.cfg.d_head, self.B.prec)
        return self._exact


def rotated(B: Backend, heads: list, rotary: Rotary, positions: list, uniform: bool = False) -> list:
    """Every head's rows (at `positions`) through their rotary rotation, by the exact layer where it
    applies (with `uniform`: one radius for all rows, `exact_rotate`), else entry by entry."""
    rot = rotary.exact()
    rows = None if rot is None else rotation_rows(rot, positions)
    tables = None if rot is None or not (B.exact and B.prec <= EXACT_MAX_PREC) else rotation_cuts(rows)   # for all heads
    fast = [exact_rotate(B, x, rows, uniform, tables) for x in heads] if rot is not None else []
    if fast and all(x is not None for x in fast):
        return fast
    angles, pairs = rotary.angles(), rotary_pairs(rotary.cfg)
    return [rotate_rows(B, x, lambda i, row: rotate(row, angles[positions[i]], pairs)) for x in heads]


def mlp_output(B: Backend, W: Weights, cfg, layer: int, X: Rows) -> Rows:
    """MLP output of block `layer` on its normalised input rows X (gated: act(x W_gate) * (x W_in) + b_in)."""
    p = f"blocks.{layer}.mlp."
    key = ("act_lipschitz", cfg.act_fn)
    if key not in W.norms:
        W.norms[key] = act_lipschitz(B, cfg.act_fn)
    if cfg.gated_mlp:
        gate = linear(B, X, W.mat(p + "W_gate"), W.norm(p + "W_gate"))
        lin = linear(B, X, W.mat(p + "W_in"), W.norm(p + "W_in"))
        post = gated(B, gate, lin, activation(B, cfg), W.norms[key], W.bias(p + "b_in"))
    else:
        pre = linear(B, X, W.mat(p + "W_in"), W.norm(p + "W_in"), W.bias(p + "b_in"))
        post = nonlinear(B, pre, activation(B, cfg), W.norms[key])
    return linear(B, post, W.mat(p + "W_out"), W.norm(p + "W_out"), W.bias(p + "b_out"))


def block(B: Backend, W: Weights, cfg, layer: int, X: Rows, queries: list, angles, where: list | None = None) -> Rows:
    """The residual stream after block `layer` at rows `queries`, from the rows X before it (with `where`:
    X holds distinct rows, position p's being X's row where[p])."""
    ln1, ln2 = ln_names(cfg, layer)
    a_in = normalised(B, W, cfg, X, ln1)
    at = queries if where is None else [where[q] for q in queries]
    resid = take(B, X, at)
    attn = attention_output(B, W, cfg, layer, a_in, queries, angles, where)
    if cfg.attn_only:
        return add(B, resid, attn)
    if cfg.parallel_attn_mlp:
        m_in = take(B, a_in, at) if ln2 == ln1 else normalised(B, W, cfg, resid, ln2)
        return add(B, resid, attn, mlp_output(B, W, cfg, layer, m_in))
    mid = add(B, resid, attn)
    return add(B, mid, mlp_output(B, W, cfg, layer, normalised(B, W, cfg, mid, ln2)))


def embed(B: Backend, W: Weights, cfg, tokens: list) -> Rows:
    """The residual stream after embedding: W_E[x_p] (+ W_pos[p] for learned positions)."""
    X = B.array(W.model.tensors["embed.W_E"][tokens])
    if cfg.positional_embedding_type == "standard":
        X = X + B.array(W.model.tensors["pos_embed.W_pos"][: len(tokens)])
    return exact_rows(B, X)


def distinct_rows(cfg, tokens: list):
    """(rows, where): the distinct tokens and each position's index among them, when the residual stream
    before block 0 depends on the token alone (no learned positions) and some token repeats; else
    (tokens, None). Block 0's normalisation and key/value projections then run once per distinct token."""
    if cfg.positional_embedding_type == "standard" or len(set(tokens)) == len(tokens):
        return tokens, None
    rows = sorted(set(tokens))
    index = {t: i for i, t in enumerate(rows)}
    return rows, [index[t] for t in tokens]


def final_state(B: Backend, model, tokens: list, W: Weights | None = None) -> Rows:
    """The last position's residual stream after all blocks (before ln_final), as one error ball."""
    cfg = model.config
    W = W or Weights(B, model)
    n = len(tokens)
    rows, where = distinct_rows(cfg, tokens)
    X = embed(B, W, cfg, rows)
    angles = Rotary(B, cfg, n) if cfg.rotary else None
    for layer in range(cfg.n_layers):
        X = block(B, W, cfg, layer, X, [n - 1] if layer == cfg.n_layers - 1 else list(range(n)), angles,
                  where if layer == 0 else None)
        if cfg.n_layers > 1:      # one block's weights at a time (a one-layer model's are reused by its kind)
            W.release(f"blocks.{layer}.")
    return X


def final_residual(B: Backend, model, tokens: list, W: Weights | None = None) -> list:
    """Entrywise enclosures of the last position's residual stream after all blocks (before ln_final)."""
    return enclosures(B, final_state(B, model, tokens, W))[0]


def unembed_input(B: Backend, model, tokens: list, W: Weights) -> Rows:
    """The last position's state the unembedding reads (after ln_final when the model has one), one ball."""
    x = final_state(B, model, tokens, W)
    return normalised(B, W, model.config, x, "ln_final") if model.config.final_ln else x


def last_logits(B: Backend, model, tokens: list, W: Weights | None = None, x: Rows | None = None) -> list:
    """Enclosures of the next-token logits at the last position of `tokens`: logit j is within
    ||x - c||_2 ||W_U[:, j]||_2 of its value at the centre c of the final (normalised) state x (given, or
    computed: `unembed_input`)."""
    W = W or Weights(B, model)
    x = x or unembed_input(B, model, tokens, W)
    logits = (x.centre @ W.mat("unembed.W_U")).rows()[0]
    e = x.eps[0]
    bias = W.bias("unembed.b_U") or [0] * len(logits)
    return [y + b + B.interval(-e * c, e * c) for y, b, c in zip(logits, bias, W.col_norms("unembed.W_U"))]
