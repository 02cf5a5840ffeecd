"""Reference forward pass in numpy float64 for every architecture a model file can declare.

This is the generator's (untrusted, fast) view of a model. It follows the model-semantics contract
that the rigorous checker implements with intervals, so a float disagreement between the two is a
bug in one of them. Everything is vectorised over a batch of token sequences; large batches are cut
into chunks (bounded memory) and the chunks are spread over a small thread pool, since numpy's
kernels release the GIL.

1-layer attention-only models without a final LayerNorm get a table-driven fast path: there every
quantity feeding the last position's logits depends only on (token, position) pairs, so queries,
keys, values and the direct path are precomputed per (position, token) and a batch only gathers
rows. `count_max_correct` goes one step further for such models and factors the computation over
the enumeration of all inputs (prefix, then a grid over the last two tokens), which is what makes
brute-force counting of all 64^4 Max-of-4 inputs take seconds rather than minutes.
"""

import math
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.special import erf

from tcert.checker.modelfile import Model, kv_names, parse_config

# Elements (float64) a chunk may materialise per intermediate; a few of these live at once, so
# the peak stays far below 4 GB even on the largest supported shapes.
_CHUNK_ELEMENTS = 1 << 24
_THREADS = max(1, min(2, os.cpu_count() or 1))
# Fast-path tables must stay small: score table is n*V*V*H, value table n*V*H*Dh.
_TABLE_LIMIT = 1 << 24

__all__ = ["as_model", "logits", "all_logits", "residuals", "predictions", "count_max_correct",
           "rotary_cos_sin", "apply_rotary"]


def as_model(tensors: dict, config: dict) -> Model:
    """Wrap in-memory `tensors` and a config dict as a `Model` without writing a file (sha256 empty)."""
    return Model(config=parse_config(dict(config)), tensors=dict(tensors), sha256="")


class _Weights:
    """Float64 copies of a model's tensors plus the derived constants the forward pass needs."""

    def __init__(self, model: Model):
        c = model.config
        self.c = c
        t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
        self.t = t
        self.eps = float(c.eps)
        self.scale = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
        h, d, dh = c.n_heads, c.d_model, c.d_head
        # Fused projections: one (D, 3*H*Dh) matmul instead of three per-head einsums.
        self.qkv_w, self.qkv_b, self.o_w = [], [], []
        # Grouped-query attention: each key/value head repeated for the n_heads / n_key_value_heads query heads
        # that read it (consecutive heads, as TransformerLens and Hugging Face repeat them).
        kv, rep = kv_names(c), h // (c.n_key_value_heads or h)
        for i in range(c.n_layers):
            p = f"blocks.{i}.attn."
            w3 = [t[p + "W_Q"]] + [np.repeat(t[p + kv[m]], rep, axis=0) for m in ("W_K", "W_V")]
            b3 = [t[p + "b_Q"]] + [np.repeat(t[p + kv[m]], rep, axis=0) for m in ("b_K", "b_V")]
            ws = [w.transpose(1, 0, 2).reshape(d, h * dh) for w in w3]
            bs = [b.reshape(h * dh) for b in b3]
            self.qkv_w.append(np.ascontiguousarray(np.concatenate(ws, axis=1)))
            self.qkv_b.append(np.concatenate(bs))
            self.o_w.append(np.ascontiguousarray(t[p + "W_O"].reshape(h * dh, d)))
        if c.rotary:
            rd = c.rotary_dim
            # theta_j = base^(-2j/rotary_dim) / rotary_scaling_factor, j = 0..rd/2-1 (the model's own base and
            # rotary_dim; linear RoPE scaling divides every frequency by the factor).
            self.theta = float(c.rotary_base) ** (-2.0 * np.arange(rd // 2) / rd) / float(c.rotary_scaling_factor)
        self._fast = {}
        self._lock = threading.Lock()


_CACHE: dict = {}


def _weights(model: Model) -> _Weights:
    """Float64 weights for `model`, cached per Model object (weights are immutable once loaded)."""
    key = id(model)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    w = _Weights(model)
    _CACHE[key] = (weakref.ref(model, lambda _r, k=key: _CACHE.pop(k, None)), w)
    return w


def _check_tokens(c, tokens: np.ndarray) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError("tokens must be a 2-D integer array (batch, positions)")
    n = tokens.shape[1]
    if not 1 <= n <= c.n_ctx:
        raise ValueError(f"sequence length {n} not in [1, n_ctx={c.n_ctx}]")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= c.d_vocab):
        raise ValueError(f"token ids must lie in [0, d_vocab={c.d_vocab})")
    return tokens.astype(np.intp, copy=False)


# ----------------------------------------------------------------------------- building blocks

def _layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = np.mean(xc * xc, axis=-1, keepdims=True)  # biased variance, as in the contract
    return xc / np.sqrt(var + eps) * w + b


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _ln(W: _Weights, x, name):
    """LayerNorm or RMSNorm `name` (e.g. 'blocks.0.ln1'), or the identity when the model has no normalization."""
    if W.c.has_rms:
        return _rms_norm(x, W.t[name + ".w"], W.eps)
    if not W.c.has_ln:
        return x
    return _layer_norm(x, W.t[name + ".w"], W.t[name + ".b"], W.eps)


def _act(x, name):
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":  # exact erf form
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "gelu_new":  # tanh approximation of GPT-2 / TransformerLens
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "silu":  # x sigmoid(x), written so that exp never overflows
        return x * np.exp(-np.logaddexp(0.0, -x))
    raise ValueError(f"unknown act_fn {name!r}")


def rotary_cos_sin(W_or_theta, positions):
    """cos and sin of the rotary angles p * theta_j: arrays of shape (len(positions), rotary_dim/2)."""
    theta = W_or_theta.theta if isinstance(W_or_theta, _Weights) else np.asarray(W_or_theta)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rotary(x, cos, sin, rotary_dim, adjacent):
    """Rotate the first `rotary_dim` components of x[..., pos, head, d_head] by the given angles.

    `cos`/`sin` have shape (pos, rotary_dim/2). Pair j is (j, j + rotary_dim/2) for GPT-NeoX
    rotate-half, (2j, 2j+1) for adjacent pairs; (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    """
    half = rotary_dim // 2
    out = x.copy()
    if adjacent:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        i1, i2 = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        i1, i2 = slice(0, half), slice(half, rotary_dim)
    c = cos[:, None, :]  # broadcast over heads
    s = sin[:, None, :]
    out[..., i1] = x1 * c - x2 * s
    out[..., i2] = x2 * c + x1 * s
    return out


def _attention(W: _Weights, i, a, q_from):
    """Attention of layer i on normalised input a (B, n, D); queries only for positions >= q_from.

    Returns (B, n - q_from, D). Computing queries for the last position alone is what makes the
    final layer cheap when only last-position logits are wanted.
    """
    c = W.c
    B, n, _ = a.shape
    h, dh = c.n_heads, c.d_head
    hd = h * dh
    wq, wk, wv = W.qkv_w[i][:, :hd], W.qkv_w[i][:, hd:2 * hd], W.qkv_w[i][:, 2 * hd:]
    bq, bk, bv = W.qkv_b[i][:hd], W.qkv_b[i][hd:2 * hd], W.qkv_b[i][2 * hd:]
    q = (a[:, q_from:] @ wq + bq).reshape(B, n - q_from, h, dh)
    k = (a @ wk + bk).reshape(B, n, h, dh)
    v = (a @ wv + bv).reshape(B, n, h, dh)
    if c.rotary:
        cos, sin = rotary_cos_sin(W, np.arange(n))
        q = apply_rotary(q, cos[q_from:], sin[q_from:], c.rotary_dim, c.rotary_adjacent_pairs)
        k = apply_rotary(k, cos, sin, c.rotary_dim, c.rotary_adjacent_pairs)
    scores = np.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1)) / W.scale  # (B,H,nq,n)
    if c.attention_dir == "causal":
        qpos = np.arange(q_from, n)[:, None]
        scores = np.where(np.arange(n)[None, :] > qpos, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    pattern = np.exp(scores)
    pattern /= pattern.sum(axis=-1, keepdims=True)
    z = np.matmul(pattern, v.transpose(0, 2, 1, 3))  # (B, H, nq, Dh)
    z = z.transpose(0, 2, 1, 3).reshape(B, n - q_from, hd)
    return z @ W.o_w[i] + W.t[f"blocks.{i}.attn.b_O"]


def _mlp(W: _Weights, i, m):
    p = f"blocks.{i}.mlp."
    t = W.t
    if W.c.gated_mlp:  # TransformerLens GatedMLP: b_in is added after the gate product
        post = _act(m @ t[p + "W_gate"], W.c.act_fn) * (m @ t[p + "W_in"]) + t[p + "b_in"]
        return post @ t[p + "W_out"] + t[p + "b_out"]
    return _act(m @ t[p + "W_in"] + t[p + "b_in"], W.c.act_fn) @ t[p + "W_out"] + t[p + "b_out"]


def _block(W: _Weights, i, resid, q_from=0):
    """Apply block i to resid (B, n, D); the result covers positions >= q_from only."""
    c = W.c
    p = f"blocks.{i}."
    a = _ln(W, resid, p + "ln1")
    out = resid[:, q_from:] + _attention(W, i, a, q_from)
    if c.attn_only:
        return out
    ln2 = p + ("ln1" if c.shared_ln else "ln2")
    if c.parallel_attn_mlp:
        # Parallel residual: the MLP reads the block's input, not the attention-updated stream.
        return out + _mlp(W, i, _ln(W, resid[:, q_from:], ln2))
    return out + _mlp(W, i, _ln(W, out, ln2))


def _embed(W: _Weights, tokens):
    x = W.t["embed.W_E"][tokens]
    if W.c.positional_embedding_type == "standard":
        x = x + W.t["pos_embed.W_pos"][: tokens.shape[1]]
    return x


def _unembed(W: _Weights, resid):
    if W.c.final_ln:
        resid = _ln(W, resid, "ln_final")
    return resid @ W.t["unembed.W_U"] + W.t["unembed.b_U"]


def _last_logits_general(W: _Weights, tokens):
    resid = _embed(W, tokens)
    n = tokens.shape[1]
    last = W.c.n_layers - 1
    for i in range(W.c.n_layers):
        resid = _block(W, i, resid, q_from=n - 1 if i == last else 0)
    return _unembed(W, resid[:, -1])


# ----------------------------------------------------------------------------- fast path

def _fast_ok(c, n) -> bool:
    if not (c.n_layers == 1 and c.attn_only and not c.final_ln):
        return False
    v, h, dh = c.d_vocab, c.n_heads, c.d_head
    return n * v * v * h <= _TABLE_LIMIT and n * v * h * dh <= _TABLE_LIMIT


def _fast_tables(W: _Weights, n):
    """Per-(position, token) tables for a 1-layer attention-only model at sequence length n.

    scores[(r*V + x_last)*V + x_r, h]: score of the last query on key position r;
    rows[r*V + x] (r < n): value vectors (all heads, padded to width max(H*Dh, D)) of token x at
    position r, and rows[n*V + x]: the residual stream of last token x (the direct path);
    out_map maps [z, resid] (H*Dh + D) to logits, out_bias = b_O W_U + b_U. All are float64
    compositions of the weights, so the result equals the general path up to rounding.
    """
    with W._lock:
        if n in W._fast:
            return W._fast[n]
        c = W.c
        v, h, dh, d = c.d_vocab, c.n_heads, c.d_head, c.d_model
        hd = h * dh
        toks = np.broadcast_to(np.arange(v)[:, None], (v, n))
        resid = _embed(W, np.ascontiguousarray(toks)).transpose(1, 0, 2)  # (n, V, D)
        a = _ln(W, resid, "blocks.0.ln1")
        qkv = a @ W.qkv_w[0] + W.qkv_b[0]  # (n, V, 3*H*Dh)
        q = qkv[n - 1, :, :hd].reshape(v, h, dh)
        k = qkv[:, :, hd:2 * hd].reshape(n, v, h, dh)
        if c.rotary:
            cos, sin = rotary_cos_sin(W, np.arange(n))
            q = apply_rotary(q[None], cos[n - 1:], sin[n - 1:], c.rotary_dim, c.rotary_adjacent_pairs)[0]
            # apply_rotary wants (..., position, head, d_head): put the token axis in front
            k = apply_rotary(k.transpose(1, 0, 2, 3), cos, sin, c.rotary_dim,
                             c.rotary_adjacent_pairs).transpose(1, 0, 2, 3)
        scores = np.einsum("xhd,ryhd->rxyh", q, k) / W.scale  # (n, V, V, H)
        width = max(hd, d)
        rows = np.zeros(((n + 1) * v, width))
        rows[:n * v, :hd] = qkv[:, :, 2 * hd:].reshape(n * v, hd)
        rows[n * v:, :d] = resid[n - 1]
        w_u = W.t["unembed.W_U"]
        out_map = np.ascontiguousarray(np.concatenate([W.o_w[0] @ w_u, w_u]))
        out_bias = W.t["blocks.0.attn.b_O"] @ w_u + W.t["unembed.b_U"]
        tables = (np.ascontiguousarray(scores.reshape(n * v * v, h)), rows, out_map, out_bias)
        W._fast[n] = tables
        return tables


def _last_logits_fast(W: _Weights, tokens):
    c = W.c
    B, n = tokens.shape
    v, h, dh, d = c.d_vocab, c.n_heads, c.d_head, c.d_model
    hd = h * dh
    scores_t, rows_t, out_map, out_bias = _fast_tables(W, n)
    last = tokens[:, -1]
    pos_off = np.arange(n) * v
    s = scores_t[(pos_off[None, :] + last[:, None]) * v + tokens]  # (B, n, H)
    s -= s.max(axis=1, keepdims=True)  # every key is visible to the last query, causal or not
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    idx = np.empty((B, n + 1), dtype=np.intp)
    idx[:, :n] = pos_off[None, :] + tokens
    idx[:, n] = n * v + last
    g = rows_t[idx]  # one gather for values and the direct path: (B, n+1, width)
    x = np.empty((B, hd + d))
    z = x[:, :hd].reshape(B, h, dh)
    np.einsum("brh,brhd->bhd", s, g[:, :n, :hd].reshape(B, n, h, dh), out=z)
    x[:, hd:] = g[:, n, :d]
    out = x @ out_map  # one matmul for W_O W_U and the direct W_U
    out += out_bias
    return out


# ----------------------------------------------------------------------------- public API

def _chunk_rows(c, n, fast) -> int:
    if fast:
        per_row = n * (c.n_heads + c.n_heads * c.d_head) + c.d_vocab + c.n_heads * c.d_head
    else:
        widest = max(c.d_model, 3 * c.n_heads * c.d_head, c.d_mlp or 0, c.n_heads * n)
        per_row = n * widest + c.d_vocab
    return max(1, _CHUNK_ELEMENTS // (4 * per_row))


def logits(model: Model, tokens_batch) -> np.ndarray:
    """Float64 logits at the last position for each sequence: tokens (B, n) -> (B, d_vocab)."""
    W = _weights(model)
    tokens = _check_tokens(W.c, tokens_batch)
    B, n = tokens.shape
    fast = _fast_ok(W.c, n)
    fn = _last_logits_fast if fast else _last_logits_general
    rows = _chunk_rows(W.c, n, fast)
    if B <= rows:
        return fn(W, tokens)
    out = np.empty((B, W.c.d_vocab))
    starts = range(0, B, rows)

    def run(s):
        out[s:s + rows] = fn(W, tokens[s:s + rows])

    with ThreadPoolExecutor(_THREADS) as pool:
        list(pool.map(run, starts))
    return out


def predictions(model: Model, tokens_batch) -> np.ndarray:
    """Greedy next token (argmax of the last position's logits; lowest id on a float tie)."""
    return logits(model, tokens_batch).argmax(axis=-1)


def residuals(model: Model, tokens) -> list:
    """Residual stream after the embedding and after each block.

    tokens (n,) gives a list of n_layers + 1 arrays of shape (n, D); tokens (B, n) gives (B, n, D).
    """
    W = _weights(model)
    arr = np.asarray(tokens)
    single = arr.ndim == 1
    t = _check_tokens(W.c, arr[None] if single else arr)
    resid = _embed(W, t)
    out = [resid]
    for i in range(W.c.n_layers):
        resid = _block(W, i, resid)
        out.append(resid)
    return [r[0] for r in out] if single else out


def all_logits(model: Model, tokens_1d) -> np.ndarray:
    """Logits at every position of one sequence: tokens (n,) -> (n, d_vocab)."""
    W = _weights(model)
    resid = residuals(model, np.asarray(tokens_1d).reshape(-1))[-1]
    return _unembed(W, resid)


def _count_rows(lg, mx, unique) -> int:
    """How many rows of logits lg (R, V) put the max token mx (R,) on top (strictly if unique)."""
    top = lg.argmax(axis=1)  # the first index attaining the row's maximum
    ok = top == mx
    if unique:
        # A row is a unique win only if no other entry equals its maximum. Exact float ties are
        # rare, so count them over the whole chunk first and look per row only when there are any.
        eq = lg == np.take_along_axis(lg, top[:, None], axis=1)
        if np.count_nonzero(eq) > len(lg):
            ok &= np.count_nonzero(eq, axis=1) == 1
    return int(np.count_nonzero(ok))


def _enum_tables(W: _Weights, n):
    """Tables for counting over all inputs of a fast-path model, or None when unsafe.

    The inputs are (prefix, a, b) with a = x_{n-2}, b = x_{n-1}. With one softmax shift m[b, h]
    (the largest score query token b can see) every exp-score is exp(S - m) <= 1 and depends on
    (r, b, x_r) only, so per head
        logits = (C[prefix, b] + e(n-2, b, a) * VO[a]) / Z[prefix, b, a] + direct[b],
    where C folds the prefix and last-position values through W_O W_U. Per input that is a few
    vector operations on d_vocab numbers and no gather or matmul. The shift is only safe when the
    last position's own term cannot underflow (it bounds Z from below independently of the prefix).
    """
    c = W.c
    v, h, dh, d = c.d_vocab, c.n_heads, c.d_head, c.d_model
    hd = h * dh
    if n < 2 or v * v * h * v > _TABLE_LIMIT:
        return None
    scores_t, rows_t, out_map, out_bias = _fast_tables(W, n)
    S = scores_t.reshape(n, v, v, h)  # S[r, b, x_r, h]
    m = S.max(axis=(0, 2))  # (V_b, H)
    diag = S[n - 1, np.arange(v), np.arange(v)] - m  # last position's own score, shifted
    if diag.min() < -500:  # exp would lose the lower bound on Z: use the plain path instead
        return None
    E = np.exp(S - m[None, :, None, :])
    vals = rows_t[:n * v, :hd].reshape(n, v, h, dh)
    ou = out_map[:hd].reshape(h, dh, -1)  # per-head W_O W_U
    vo = np.einsum("xhd,hdo->xho", vals[n - 2], ou)  # (V_a, H, V) value of a, through to logits
    grid = E[n - 2][..., None] * vo[None]  # (V_b, V_a, H, V)
    el = np.exp(diag)  # (V_b, H)
    base_c = (el[..., None] * vals[n - 1]).astype(np.float64)  # (V_b, H, Dh): last position's own value
    direct = rows_t[n * v:, :d] @ out_map[hd:] + out_bias  # (V_b, V)
    return E, vals, ou, grid, el, base_c, direct


def _count_enumerated(W: _Weights, n, unique, tables) -> int:
    E, vals, ou, grid, el, base_c, direct = tables
    c = W.c
    v, h = c.d_vocab, c.n_heads
    head = n - 2
    n_prefix = v ** head
    # Work items of about 2^19 logits: small enough to stay in cache, large enough to amortise calls.
    per = max(1, (1 << 19) // (v * v * v))
    place = v ** np.arange(head - 1, -1, -1)
    ab_max = np.maximum(np.arange(v)[:, None], np.arange(v)[None, :])  # max(b, a): (V_b, V_a)
    if h == 1:
        # One head: every row's logits share the positive denominator Z, so Z * logits has the
        # same order and the division can be skipped. Fold direct[b] into both numerator parts:
        # (C + G)/Z + D = (C + D*zp + G + D*e_a)/Z.
        grid1 = grid[:, :, 0, :] + direct[:, None, :] * E[n - 2][:, :, 0, None]  # (V_b, V_a, V)

    def run(start):
        pre = np.arange(start, min(start + per, n_prefix))
        digits = (pre[:, None] // place[None, :]) % v if head else np.zeros((len(pre), 0), np.intp)
        P = len(pre)
        num = np.broadcast_to(base_c, (P, v) + base_c.shape[1:]).copy()  # (P, V_b, H, Dh)
        zp = np.broadcast_to(el, (P, v, h)).copy()  # (P, V_b, H)
        for r in range(head):
            e = E[r][:, digits[:, r]].transpose(1, 0, 2)  # (P, V_b, H)
            num += e[..., None] * vals[r][digits[:, r]][:, None]
            zp += e
        cvec = np.einsum("pbhd,hdo->pbho", num, ou)  # (P, V_b, H, V)
        if h == 1:
            c1 = cvec[:, :, 0, :] + direct[None] * zp[:, :, 0, None]
            lg = c1[:, :, None, :] + grid1[None]  # (P, V_b, V_a, V): Z * logits
        else:
            lg = np.zeros((P, v, v, c.d_vocab))
            for hh in range(h):
                z = zp[:, :, None, hh] + E[n - 2][None, :, :, hh]  # (P, V_b, V_a)
                part = cvec[:, :, None, hh, :] + grid[None, :, :, hh, :]
                part /= z[..., None]
                lg += part
            lg += direct[None, :, None, :]
        pmax = digits.max(axis=1) if head else np.zeros(P, np.intp)
        mx = np.maximum(pmax[:, None, None], ab_max[None])
        return _count_rows(lg.reshape(-1, c.d_vocab), mx.reshape(-1), unique)

    with ThreadPoolExecutor(_THREADS) as pool:
        return sum(pool.map(run, range(0, n_prefix, per)))


def count_max_correct(model: Model, n=None, unique=True) -> int:
    """Number of the d_vocab^n inputs whose prediction is the max token (Max-of-K accuracy).

    With unique=True an input counts only when the max token's logit is strictly above every other
    logit (a tie is not a correct answer); with unique=False argmax's lowest-index tie-break is used.
    1-layer attention-only models are counted by `_count_enumerated` (the same float64 formula,
    factored over the enumeration); others run `logits` over all inputs chunk by chunk.
    """
    W = _weights(model)
    c = W.c
    n = c.n_ctx if n is None else n
    _check_tokens(c, np.zeros((1, n), dtype=np.intp))
    v = c.d_vocab
    total = v ** n
    fast = _fast_ok(c, n)
    tables = _enum_tables(W, n) if fast else None
    if tables is not None:
        return _count_enumerated(W, n, unique, tables)
    fn = _last_logits_fast if fast else _last_logits_general
    rows = _chunk_rows(c, n, fast)
    place = v ** np.arange(n - 1, -1, -1)

    def run(start):
        flat = np.arange(start, min(start + rows, total))
        toks = (flat[:, None] // place[None, :]) % v
        return _count_rows(fn(W, toks), toks.max(axis=1), unique)

    with ThreadPoolExecutor(_THREADS) as pool:
        return sum(pool.map(run, range(0, total, rows)))
