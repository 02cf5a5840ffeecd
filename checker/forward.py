"""The model's forward pass in interval arithmetic: enclosures of the exact real-number logits.

Semantics (docs/model-format.md): pre-LN blocks, LayerNorm or RMSNorm with exact eps, multi-head attention
(optionally grouped-query) with optional rotary embeddings (optionally linearly scaled) and causal mask,
ReLU/GELU/SiLU MLP (optionally gated), optional parallel residual, shared LN and final LN. Every function takes a `Backend` and returns enclosures; no float arithmetic decides
anything. Rows that later layers do not need are not computed (only the last query row of the last
block matters for next-token logits).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.interval import Backend, IMat
from tcert.checker.modelfile import kv_names

GELU_NEW_CUBIC = Fraction(44715, 1000000)


class Weights:
    """Exact interval copies of a model's tensors, converted once per check."""

    def __init__(self, backend: Backend, model):
        self.B, self.model, self.cache = backend, model, {}

    def mat(self, name: str, head: int | None = None) -> IMat:
        """Tensor `name` (or its slice for `head`) as an interval matrix; vectors become rows."""
        key = (name, head)
        if key not in self.cache:
            t = self.model.tensors[name]
            self.cache[key] = self.B.array(t if head is None else t[head])
        return self.cache[key]

    def heads_concat(self, name: str) -> IMat:
        """W_Q/W_K/W_V of all heads side by side: (d_model, n_heads * d_head)."""
        key = (name, "concat")
        if key not in self.cache:
            t = self.model.tensors[name]
            self.cache[key] = self.B.array(np.concatenate(list(t), axis=1))
        return self.cache[key]

    def vec(self, name: str, head: int | None = None) -> list:
        """A bias or LN vector as a list of interval scalars."""
        return self.mat(name, head).rows()[0]


def attn_divisor(B: Backend, cfg):
    """The number attention scores are divided by: config attn_scale, default sqrt(d_head)."""
    return B.num(cfg.attn_scale) if cfg.attn_scale is not None else B.sqrt(B.num(cfg.d_head))


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


def rotary_angles(B: Backend, cfg, positions) -> dict:
    """cos/sin enclosures of p * rotary_base^(-2j/rotary_dim) for each position p, pair j."""
    if not cfg.rotary:   # positional_embedding_type "none": no pairs, the rotation is the identity
        return {p: ([], []) for p in positions}
    half = cfg.rotary_dim // 2
    log_base = B.log(B.num(cfg.rotary_base))
    thetas = [B.exp(B.num(Fraction(-2 * j, cfg.rotary_dim)) * log_base) for j in range(half)]
    out = {}
    for p in positions:   # linear RoPE scaling: position p turns like position p / rotary_scaling_factor
        angles = [B.num(Fraction(p) / cfg.rotary_scaling_factor) * t for t in thetas]
        out[p] = ([B.cos(a) for a in angles], [B.sin(a) for a in angles])
    return out


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


def softmax(B: Backend, scores: list) -> list:
    """Enclosures of softmax(scores); shifting by a constant does not change the exact value."""
    shift = B.num(max(B.upper(s) for s in scores))
    e = [B.exp(s - shift) for s in scores]
    total = B.fsum(e)
    return [x / total for x in e]


def kv_head(cfg, h: int) -> int:
    """The key/value head query head h reads: h itself, or h // (n_heads / n_key_value_heads) with grouped-query
    attention (TransformerLens and Hugging Face repeat each key/value head for consecutive query heads)."""
    return h if cfg.n_key_value_heads is None else h // (cfg.n_heads // cfg.n_key_value_heads)


def keys_values(B: Backend, W: Weights, cfg, layer: int, X: IMat, angles) -> list:
    """Per key/value head g: (its keys, rotated to their positions, and its values) for every row of X."""
    p, kv, dh = f"blocks.{layer}.attn.", kv_names(cfg), cfg.d_head
    K, V = (X @ W.heads_concat(p + kv["W_K"])).rows(), (X @ W.heads_concat(p + kv["W_V"])).rows()
    pairs, out = rotary_pairs(cfg), []
    for g in range(cfg.n_key_value_heads or cfg.n_heads):
        sl, bk, bv = slice(g * dh, (g + 1) * dh), W.vec(p + kv["b_K"], g), W.vec(p + kv["b_V"], g)
        keys = [[a + c for a, c in zip(row[sl], bk)] for row in K]
        if pairs:
            keys = [rotate(k, angles[r], pairs) for r, k in enumerate(keys)]
        out.append((B.matrix(keys), B.matrix([[a + c for a, c in zip(row[sl], bv)] for row in V])))
    return out


def attention(B: Backend, W: Weights, cfg, layer: int, X: IMat, queries: list, angles) -> IMat:
    """Attention output (rows = `queries`) of block `layer` given its normalised input X (n, d_model)."""
    p = f"blocks.{layer}.attn."
    n, dh = X.shape[0], cfg.d_head
    x_rows = X.rows()
    Xq = X if len(queries) == n else B.matrix([x_rows[q] for q in queries])
    Q = (Xq @ W.heads_concat(p + "W_Q")).rows()
    kvs = keys_values(B, W, cfg, layer, X, angles)
    div = attn_divisor(B, cfg)
    pairs = rotary_pairs(cfg) if cfg.rotary else None
    zero = B.num(0)
    out = None
    for h in range(cfg.n_heads):
        sl = slice(h * dh, (h + 1) * dh)
        bq = W.vec(p + "b_Q", h)
        keys, vals = kvs[kv_head(cfg, h)]
        qs = [[a + c for a, c in zip(Q[i][sl], bq)] for i in range(len(queries))]
        if pairs:
            qs = [rotate(qs[i], angles[q], pairs) for i, q in enumerate(queries)]
        scores = (B.matrix(qs) @ keys.T).rows()
        pattern = []
        for i, q in enumerate(queries):
            visible = q + 1 if cfg.attention_dir == "causal" else n
            row = softmax(B, [s / div for s in scores[i][:visible]])
            pattern.append(row + [zero] * (n - visible))
        head_out = (B.matrix(pattern) @ vals) @ W.mat(p + "W_O", h)
        out = head_out if out is None else out + head_out
    return out + B.matrix([W.vec(p + "b_O")] * len(queries))


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


def mlp(B: Backend, W: Weights, cfg, layer: int, X: IMat) -> IMat:
    """MLP output of block `layer` on its normalised input X."""
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


def embed(B: Backend, W: Weights, cfg, tokens: list) -> IMat:
    """The residual stream after embedding: W_E[x_p] (+ W_pos[p] for learned positions)."""
    E = W.model.tensors["embed.W_E"][tokens]
    X = B.array(E)
    if cfg.positional_embedding_type == "standard":
        X = X + B.array(W.model.tensors["pos_embed.W_pos"][: len(tokens)])
    return X


def final_residual(B: Backend, model, tokens: list, W: Weights | None = None) -> list:
    """Enclosure of the last position's residual stream after all blocks (before ln_final)."""
    cfg = model.config
    W = W or Weights(B, model)
    n = len(tokens)
    X = embed(B, W, cfg, tokens)
    angles = rotary_angles(B, cfg, range(n)) if cfg.rotary else None
    rows = list(range(n))
    for layer in range(cfg.n_layers):
        last = layer == cfg.n_layers - 1
        queries = [n - 1] if last else rows
        ln1, ln2 = ln_names(cfg, layer)
        a_in = layer_norm(B, X, W, ln1, cfg.eps)
        resid = B.matrix([X.rows()[-1]]) if last else X
        attn_out = attention(B, W, cfg, layer, a_in, queries, angles)
        if cfg.attn_only:
            X = resid + attn_out
            continue
        if cfg.parallel_attn_mlp:
            m_in = a_in if ln2 == ln1 else layer_norm(B, X, W, ln2, cfg.eps)
            m_in = B.matrix([m_in.rows()[-1]]) if last else m_in
            X = resid + attn_out + mlp(B, W, cfg, layer, m_in)
        else:
            mid = resid + attn_out
            X = mid + mlp(B, W, cfg, layer, layer_norm(B, mid, W, ln2, cfg.eps))
    return X.rows()[-1]


def last_logits(B: Backend, model, tokens: list, W: Weights | None = None) -> list:
    """Enclosures of the next-token logits at the last position of `tokens`."""
    cfg = model.config
    W = W or Weights(B, model)
    x = final_residual(B, model, tokens, W)
    if cfg.final_ln:
        x = norm_row(B, W, x, "ln_final", cfg.eps)
    logits = B.matrix([x]) @ W.mat("unembed.W_U")
    return [a + b for a, b in zip(logits.rows()[0], W.vec("unembed.b_U"))]
