"""Worst-case search by a near-constant residual: the LayerNorm flip (generator only, float64).

The certified constants of a trained 2-4 layer text model are sums of every block's diameters because no
variance lower bound holds at the last position: for a few last tokens q (rare ones, whose embedding the model
barely moved) the residual entering block 1 is q's own part plus block 0's attention output, and the attention
output can nearly cancel q's centred part. There the normalisation divides by a tiny standard deviation, so one
changed key that moves the attention output a little turns block 1's normalised input a long way around its
sphere, and every block from 1 on reads a different vector. This module searches for such inputs directly:

1. `flat_queries`: the last tokens whose own part of the block-1 input (embedding, block 0's MLP of it and b_O)
   has the smallest centred norm;
2. `flip_influence`: per such q, a context chosen position by position (every token at each position, in one
   vectorised step) to make the block-1 input nearly constant, then re-chosen, together with the pair (a, b) at
   the changed position, to maximise the distance between the two normalised block-1 inputs; then the worst
   pair at i by the real movement (`context_pairs`).

Block 0's last row depends on each key's token and its distance to the last position only when block 0 reads
tokens alone (rotary or no position embedding), which the tables here need. Every figure returned is the
uncached forward pass's (`pair_movement`); `search_long.polish_influence` continues from the witnesses.
"""

import numpy as np

from tcert.generator.influence.search import context_pairs, pair_movement
from tcert.generator.influence.search_long import _block0_qkv, _distance_scores
from tcert.generator.model.forward import _layer_norm, _ln, _mlp, _rms_norm, _weights

__all__ = ["flat_queries", "block1_inputs", "flip_profile", "flip_influence"]


def _require_token_rows(model):
    """Refuse models the tables cannot describe: block 0 must read tokens alone, and block 1 must be normalised."""
    c = model.config
    if c.positional_embedding_type == "standard":
        raise ValueError("the flip search needs block-0 rows that depend on the token alone (rotary or no positions)")
    if c.n_layers < 2 or not (c.has_ln or c.has_rms):
        raise ValueError("the flip search needs a normalised block 1 (n_layers >= 2, LayerNorm or RMSNorm)")


def _after_block0(W, q: int, attn):
    """The last position's residual after block 0 when it holds token q and block 0's attention output (b_O
    included) there is each row of `attn` (B, d)."""
    c = W.c
    x = W.t["embed.W_E"][q][None]
    out = x + attn
    if c.attn_only:
        return out
    ln = "blocks.0." + ("ln1" if c.shared_ln else "ln2")
    # parallel: the MLP reads the block's input, q's embedding alone
    return out + _mlp(W, 0, _ln(W, x if c.parallel_attn_mlp else out, ln))


def _centred(W, x):
    """P x per row (P the centring of LayerNorm; the identity for RMSNorm)."""
    return x - x.mean(axis=-1, keepdims=True) if W.c.has_ln else x


def _normalised(W, x):
    """The normalisation of block 1 without its gain and bias (the forward pass's, with gain 1 and bias 0): P x
    divided by the standard deviation with eps. Rows of x (B, d)."""
    return _layer_norm(x, 1.0, 0.0, W.eps) if W.c.has_ln else _rms_norm(x, 1.0, W.eps)


def _centred_norm(W, x):
    """||P x|| per row."""
    return np.linalg.norm(_centred(W, x), axis=-1)


class _LastRow:
    """Block 0's last row of inputs of length n ending in q, by tables: per head the unnormalised weight
    e^(score - shift) of every token at every distance (H, V, n) and every token's value times W_O (H, V, d)."""

    def __init__(self, W, q: int, n: int):
        c = W.c
        H, dh = c.n_heads, c.d_head
        qkv = _block0_qkv(W)
        scores, vals = [], []
        for h in range(H):
            qh = qkv[q, h * dh:(h + 1) * dh][None]
            scores.append(_distance_scores(W, qh, qkv[:, (H + h) * dh:(H + h + 1) * dh], n)[0] / W.scale)
            vals.append(qkv[:, (2 * H + h) * dh:(2 * H + h + 1) * dh] @ W.o_w[0][h * dh:(h + 1) * dh])
        scores = np.stack(scores)
        # One shift per head (a row's tokens are not known here): every weight of a row stays a normal float64
        # while each head's scores span less than ~700.
        top = scores.max(axis=(1, 2), keepdims=True)
        span = float((top[:, 0, 0] - scores.min(axis=(1, 2))).max())
        if span > 700:
            raise ValueError(f"block 0's scores span {span:.0f} > 700 in one head: too wide for the flip tables")
        self.E = np.exp(scores - top)
        self.vals = np.stack(vals)
        self.W, self.q, self.n = W, q, n
        self.b_O = W.t["blocks.0.attn.b_O"]

    def _sums(self, tokens):
        """Per head: the weights of the row (H, n), their numerator sum_r e_r v_r (H, d) and denominator (H,)."""
        e = self.E[:, tokens, self.n - 1 - np.arange(self.n)]
        return e, np.einsum("hr,hrd->hd", e, self.vals[:, tokens]), e.sum(axis=1)

    def inputs(self, tokens):
        """The block-1 input at the last position of `tokens` (length n, last = q): (d,)."""
        _, num, den = self._sums(tokens)
        return _after_block0(self.W, self.q, (self.b_O + (num / den[:, None]).sum(axis=0))[None])[0]

    def swaps(self, tokens, r: int):
        """The block-1 inputs at the last position with position r of `tokens` set to each token in turn: (V, d)."""
        e, num, den = self._sums(tokens)
        er, d = e[:, r], self.n - 1 - r
        num = num[:, None] - er[:, None, None] * self.vals[:, tokens[r]][:, None] + self.E[:, :, d, None] * self.vals
        den = den[:, None] - er[:, None] + self.E[:, :, d]
        return _after_block0(self.W, self.q, self.b_O + (num / den[..., None]).sum(axis=0))


def block1_inputs(model, tokens) -> np.ndarray:
    """The block-1 input at the last position of `tokens` by the tables of this module (to compare with the
    forward pass's `residuals(model, tokens)[1][-1]`)."""
    _require_token_rows(model)
    tokens = np.asarray(tokens, dtype=np.intp)
    return _LastRow(_weights(model), int(tokens[-1]), len(tokens)).inputs(tokens)


def flip_profile(model, tokens, i: int, a: int, b: int):
    """What a witness does at block 1's normalisation: (centred norm of the last position's block-1 input with a
    at i, the same with b, ||N(x_a) - N(x_b)|| with N the normalisation without gain and bias; at most 2 sqrt(d)
    for LayerNorm)."""
    tokens = np.array(tokens, dtype=np.intp)
    tokens[i] = a
    xa = block1_inputs(model, tokens)
    tokens[i] = b
    xb = block1_inputs(model, tokens)
    W = _weights(model)
    na, nb = _centred_norm(W, np.stack([xa, xb]))
    return float(na), float(nb), float(_flip_distance(W, xa[None], xb[None])[0])


def flat_queries(model, count: int) -> np.ndarray:
    """The `count` last tokens whose own part of the block-1 input (block 0's attention output left out, b_O kept)
    has the smallest centred norm, smallest first."""
    _require_token_rows(model)
    W = _weights(model)
    V = model.config.d_vocab
    own = np.stack([_after_block0(W, q, W.t["blocks.0.attn.b_O"][None])[0] for q in range(V)])
    return np.argsort(_centred_norm(W, own), kind="stable")[:count]


def _flip_distance(W, xa, xb):
    """||N(xa) - N(xb)|| per row, N the unscaled normalisation of block 1."""
    return np.linalg.norm(_normalised(W, xa) - _normalised(W, xb), axis=-1)


def _flatten(row, tokens, i: int, rounds: int, rng) -> float:
    """Coordinate descent on the centred norm of the block-1 input over every position but i and the last
    (in place on `tokens`); returns the norm reached."""
    W = row.W
    best = float(_centred_norm(W, row.inputs(tokens)[None])[0])
    for _ in range(rounds):
        for r in rng.permutation(row.n - 1):
            if r != i:
                c = _centred_norm(W, row.swaps(tokens, r))
                t = int(c.argmin())
                if c[t] < best:
                    best, tokens[r] = float(c[t]), t
    return best


def _spread(row, tokens, i: int, a: int, b: int, rounds: int, rng):
    """Coordinate ascent on ||N(x_a) - N(x_b)|| (x_a, x_b the block-1 inputs with a, with b at i) over a, b and
    every other position but the last (in place on `tokens`); returns (distance, a, b)."""
    W = row.W

    def variants(r):
        """The block-1 inputs with a at i and with b at i, each as position r takes every token: two (V, d)."""
        ta, tb = tokens.copy(), tokens.copy()
        ta[i], tb[i] = a, b
        return row.swaps(ta, r), row.swaps(tb, r)

    every = row.swaps(tokens, i)    # the block-1 input with each token at i (whatever tokens[i] holds)
    best = float(_flip_distance(W, every[a][None], every[b][None])[0])
    for _ in range(rounds):
        every = row.swaps(tokens, i)
        for side in ("b", "a"):     # the best b against a, then the best a against that b
            dist = _flip_distance(W, every, every[a if side == "b" else b][None])
            t = int(dist.argmax())
            if dist[t] > best:
                best = float(dist[t])
                a, b = (a, t) if side == "b" else (t, b)
        for r in rng.permutation(row.n - 1):
            if r != i:
                xa, xb = variants(r)
                dist = _flip_distance(W, xa, xb)
                t = int(dist.argmax())
                if dist[t] > best:
                    best, tokens[r] = float(dist[t]), t
    return best, a, b


def flip_influence(model, n: int, queries=None, i=None, flat_rounds: int = 3, rounds: int = 3, seed: int = 0,
                   chunk: int = 256):
    """The largest single-token change found by the flip search at length n: per last token q in `queries`
    (None: the 8 `flat_queries`), a random context flattened (`flat_rounds` sweeps), then `rounds` sweeps of the
    flip ascent, then the worst pair at i over every token. i: the changed position (None: n - 2).
    Returns (||y - y'||_2, ||p - p'||_1, tokens, i, a, b) of the largest, by `pair_movement`."""
    _require_token_rows(model)
    if not 2 <= n <= model.config.n_ctx:
        raise ValueError(f"n = {n} not in [2, n_ctx = {model.config.n_ctx}]")
    i = n - 2 if i is None else int(i)
    if not 0 <= i <= n - 2:
        raise ValueError(f"the changed position {i} is not a non-final position of length {n}")
    W, V = _weights(model), model.config.d_vocab
    queries = flat_queries(model, 8) if queries is None else queries
    rng = np.random.default_rng(seed)
    best = None
    for q in (int(v) for v in queries):
        row = _LastRow(W, q, n)
        tokens = rng.integers(0, V, n)
        tokens[-1] = q
        a = int(tokens[i])
        _flatten(row, tokens, i, flat_rounds, rng)
        _, a, b = _spread(row, tokens, i, a, a, rounds, rng)
        a, b = context_pairs(model, tokens, i, np.arange(V), chunk=chunk)[2:]
        tokens[i] = a
        found = (*pair_movement(model, tokens, i, a, b), tokens.copy(), i, a, b)
        if best is None or found[0] > best[0]:
            best = found
    return best
