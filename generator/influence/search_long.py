"""Combinatorial searches for the worst single-token change at long inputs (causal models), on top of the
key/value reuse of `search.py`: a witness found at a shorter length keeps its tail (the change and the tokens
around it) and gets a new, position-dependent filler before it.

  tail_scan        the movement of f...f + tail for every filler f (the all-f prefix cached once per filler)
  segment_fillers  coordinate ascent over runs of the prefix: each run of positions filled with one token
  wide_ascent      coordinate ascent over many context positions, candidates = the window's own tokens + a sample
  grown_influence  the three in turn, then a new worst pair at the change (every token)
  polish_influence iterated local search (wide_ascent over every position, perturbed restarts) at one length
  last_row_weights the block-by-block attention row of the last position (a sink probe)
  block0_weight_caps / block0_reach  the most weight one position can take in the last row of block 0 at
                   length n, and the most that row's block-0 output can move by one change (why moves fall)

Every figure is a lower bound on the true worst change: each search returns its witness, whose movement the
uncached `search.pair_movement` recomputes.
"""

import numpy as np

from tcert.generator.influence.search import context_pairs, pair_movement, prefix_cache, suffix_states


def _pair_rows(rows, j, a, b):
    """Each row of `rows` (B, s) twice, with a and then b at column j: (2B, s)."""
    out = np.repeat(np.asarray(rows, dtype=np.intp), 2, axis=0)
    out[:, j] = np.tile([a, b], len(rows))
    return out


def _moves(model, cache, rows, chunk):
    """||y_a - y_b||_2 of consecutive row pairs (as `_pair_rows` lays them out) behind `cache`."""
    y, _ = suffix_states(model, cache, rows, chunk)
    return np.linalg.norm(y[0::2] - y[1::2], axis=1)


def _fill_moves(model, tokens, lo, hi, cands, i, a, b, chunk, stop=None):
    """||y_a - y_b||_2 of `tokens` (a, and b, at i) with each candidate token written over positions lo..hi-1
    (with `stop`: over hi..stop-1 only, the rows still recomputed from lo), behind the cached prefix tokens[:lo]."""
    first, last = (lo, hi) if stop is None else (hi, stop)
    rows = np.repeat(tokens[None, lo:], len(cands), axis=0)
    rows[:, first - lo:last - lo] = cands[:, None]
    return _moves(model, prefix_cache(model, tokens[:lo]), _pair_rows(rows, i - lo, a, b), chunk)


def tail_scan(model, n: int, tail, j: int, a: int, b: int, fillers=None, chunk: int = 64) -> np.ndarray:
    """Movements ||y_a - y_b||_2 of the length-n inputs f...f + `tail` with a, and with b, at tail position j,
    for every filler f of `fillers` (None: every token): one array entry per filler. The all-f prefix is
    computed once per filler (`prefix_cache`), the two tails behind it together."""
    tail = np.asarray(tail, dtype=np.intp)
    k = len(tail)
    if not (0 <= j < k - 1 and k < n):
        raise ValueError(f"tail of {k} with the change at {j}: need 0 <= j < {k - 1} and {k} < n = {n}")
    fillers = np.arange(model.config.d_vocab) if fillers is None else np.asarray(fillers, dtype=np.intp)
    rows = _pair_rows(tail[None], j, a, b)
    return np.array([_moves(model, prefix_cache(model, np.full(n - k, int(f))), rows, chunk)[0] for f in fillers])


def segment_fillers(model, tokens, i: int, a: int, b: int, end: int, segments: int = 16, candidates=(),
                    sweeps: int = 2, chunk: int = 4):
    """Coordinate ascent over the filler region 0..end-1 (end <= i) of a fixed changed pair: the region is cut
    into `segments` runs of (nearly) equal length and, run by run from the one nearest the change back to
    position 0, every token of `candidates` fills the whole run in turn; the run keeps the token that makes
    ||y_a - y_b|| largest (inputs `tokens` with a, and with b, at i). The prefix before the run is cached, each
    candidate recomputes from the run's start on. Rotary models score a key by its distance, so the best filler
    far from the last position need not be the best near it. Returns (||y_a - y_b||, tokens), never below the
    start's movement."""
    tokens = np.array(tokens, dtype=np.intp)
    if not 0 < end <= i < len(tokens) - 1:
        raise ValueError(f"filler region 0..{end - 1} and change at {i}: need 0 < end <= i < n - 1")
    edges = np.unique(np.linspace(0, end, min(segments, end) + 1).astype(int))
    best = pair_movement(model, tokens, i, a, b)[0]
    cands = np.unique(np.asarray(candidates, dtype=np.intp))
    for _ in range(sweeps):
        for lo, hi in zip(edges[-2::-1], edges[:0:-1]):
            d = _fill_moves(model, tokens, lo, hi, cands, i, a, b, chunk)
            k = int(np.argmax(d)) if len(d) else 0
            if len(d) and d[k] > best:
                best, tokens[lo:hi] = float(d[k]), cands[k]
    return best, tokens


def wide_ascent(model, tokens, i: int, a: int, b: int, positions, extra: int = 32, rounds: int = 1,
                seed: int = 0, chunk: int = 64):
    """Coordinate ascent over the context of a fixed changed pair (as `search.context_ascent`) whose candidates
    at each position are every distinct token already in the window (from min(positions, i) on: the witnesses
    found repeat a few tokens) plus `extra` random tokens (>= d_vocab: every token), so that many positions can
    be visited at n = 1024. A row for position j recomputes only from min(j, i) on. Returns (||y_a - y_b||,
    tokens), never below the start's movement."""
    rng = np.random.default_rng(seed)
    V = model.config.d_vocab
    tokens = np.array(tokens, dtype=np.intp)
    positions = [int(j) for j in positions if int(j) != i]
    window = min(positions + [i])
    best = pair_movement(model, tokens, i, a, b)[0]
    for _ in range(rounds):
        for j in positions:
            start = min(j, i)
            pool = [tokens[window:], [a, b], np.arange(V) if extra >= V else rng.choice(V, extra, replace=False)]
            cands = np.unique(np.concatenate(pool).astype(np.intp))
            d = _fill_moves(model, tokens, start, j, cands, i, a, b, chunk, j + 1)
            k = int(np.argmax(d))
            if d[k] > best:
                best, tokens[j] = float(d[k]), cands[k]
    return best, tokens


def grown_influence(model, n: int, tail, j: int, a: int, b: int, fillers=None, keep: int = 16, segments: int = 16,
                    sweeps: int = 2, depth: int = 32, extra: int = 32, rounds: int = 2, restarts: int = 0,
                    seed: int = 0, chunk: int = 64):
    """A witness carried to length n (causal models): `tail` (e.g. the last tokens of a witness found at a
    shorter length, the change at tail position j) behind the best filler of `tail_scan` over `fillers` (None:
    every token); then `segment_fillers` with the `keep` best fillers as candidates; then `rounds` of
    `wide_ascent` over the last token, the tail positions after the change and the `depth` positions before it,
    each followed by a new worst pair at the change over every token (`context_pairs`). Each of `restarts`
    further runs of those rounds starts from the best input with the ascent's positions drawn at random.
    Returns (||y - y'||_2, ||p - p'||_1, tokens, i, a, b) of the largest found (the two inputs: `tokens` with a,
    and with b, at i)."""
    rng = np.random.default_rng(seed)
    tail = np.asarray(tail, dtype=np.intp)
    k, V = len(tail), model.config.d_vocab
    fill = np.arange(V) if fillers is None else np.asarray(fillers, dtype=np.intp)
    scan = tail_scan(model, n, tail, j, a, b, fill, chunk)
    order = np.argsort(-scan, kind="stable")
    tokens = np.concatenate([np.full(n - k, int(fill[order[0]])), tail])
    i = n - k + j
    tokens[i] = a
    if segments > 1 and keep > 1:
        _, tokens = segment_fillers(model, tokens, i, a, b, n - k, segments, fill[order[:keep]], sweeps)
    positions = [n - 1] + list(range(i + 1, n - 1)) + list(range(i - 1, max(-1, i - 1 - depth), -1))
    best = (*pair_movement(model, tokens, i, a, b), tokens.copy(), i, a, b)
    return _restarted_ascent(model, best, positions, lambda rng: positions, rounds, extra, restarts, seed, chunk, rng)


def polish_influence(model, tokens, i: int, a: int, b: int, positions=None, extra: int = 32, rounds: int = 2,
                     restarts: int = 0, perturb: float = 0.25, seed: int = 0, chunk: int = 64):
    """Iterated local search around one witness (causal models): `rounds` of `wide_ascent` over `positions`
    (None: every position but i, the last token and those after i first, then outward from i), each followed
    by a new worst pair at i over every token; then `restarts` times the same from the best input with a random
    `perturb` fraction of those positions redrawn. Returns (||y - y'||_2, ||p - p'||_1, tokens, i, a, b) of the
    largest found, never below the start's."""
    rng = np.random.default_rng(seed)
    tokens = np.array(tokens, dtype=np.intp)
    n = len(tokens)
    if positions is None:
        positions = [n - 1] + list(range(i + 1, n - 1)) + list(range(i - 1, -1, -1))
    positions = [int(j) for j in positions if int(j) != i]
    tokens[i] = a
    best = (*pair_movement(model, tokens, i, a, b), tokens.copy(), i, a, b)
    count = max(1, int(perturb * len(positions)))
    return _restarted_ascent(model, best, positions, lambda rng: rng.choice(positions, count, replace=False), rounds,
                             extra, restarts, seed, chunk, rng)


def _restarted_ascent(model, best, positions, redrawn, rounds: int, extra: int, restarts: int, seed: int, chunk: int,
                      rng):
    """The largest (||y - y'||_2, ||p - p'||_1, tokens, i, a, b) of `rounds` of `wide_ascent` over `positions`, each
    followed by a new worst pair at i over every token, run from the witness `best` and then `restarts` times from
    the best so far with the positions `redrawn(rng)` drawn at random (`grown_influence`, `polish_influence`)."""
    i, V = best[3], model.config.d_vocab
    tokens, a, b = best[2].copy(), best[4], best[5]
    for s in range(restarts + 1):
        if s:
            tokens, a, b = best[2].copy(), best[4], best[5]
            redraw = redrawn(rng)
            tokens[redraw] = rng.integers(0, V, len(redraw))
        for r in range(rounds):
            _, tokens = wide_ascent(model, tokens, i, a, b, positions, extra, 1, seed + s * rounds + r, chunk)
            dy, dp, a, b = context_pairs(model, tokens, i, np.arange(V), chunk=chunk)
            tokens[i] = a
            if dy > best[0]:
                best = (dy, dp, tokens.copy(), i, a, b)
    return best


def last_row_weights(model, tokens) -> np.ndarray:
    """The attention weights of the last position of one input on every position, per block and head
    (L, H, n), float64: e.g. whether position 0 is a sink that every later row reads."""
    from tcert.generator.influence.search import _keys_values
    from tcert.generator.model.forward import _block, _embed, _ln, _weights, apply_rotary, rotary_cos_sin
    W = _weights(model)
    c = W.c
    resid, out = _embed(W, np.asarray(tokens, dtype=np.intp)[None]), []
    n, H, dh = resid.shape[1], c.n_heads, c.d_head
    for i in range(c.n_layers):
        a = _ln(W, resid, f"blocks.{i}.ln1")
        k, _ = _keys_values(W, i, a, 0)
        q = (a[:, -1:] @ W.qkv_w[i][:, :H * dh] + W.qkv_b[i][:H * dh]).reshape(1, 1, H, dh)
        if c.rotary:
            cos, sin = rotary_cos_sin(W, np.arange(n - 1, n))
            q = apply_rotary(q, cos, sin, c.rotary_dim, c.rotary_adjacent_pairs)
        s = np.einsum("hd,khd->hk", q[0, 0], k[0]) / W.scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out.append(p / p.sum(axis=1, keepdims=True))
        resid = _block(W, i, resid)
    return np.array(out)


def block0_weight_caps(model, lengths, queries=None, chunk: int = 16) -> np.ndarray:
    """For each last token q of `queries` (None: every token), each n of `lengths` and each head of block 0: the
    largest weight the last row of an input of length n ending in q can give one position, over all inputs
    (float64; block-0 keys depend on the token and a rotation only). At distance d from the last position it is
    e^M_d / (e^M_d + e^s_own + sum_(r != d) e^m_r), M_d the highest score q gives any token at distance d, m_r
    the lowest at distance r, s_own q's score of itself (every position's token is free, so it is attained);
    the maximum over d = 1..n-1. An array (queries, lengths, heads)."""
    from tcert.generator.model.forward import _weights
    W = _weights(model)
    c = W.c
    if c.positional_embedding_type == "standard":
        raise ValueError("block-0 caps need keys that depend on the token and a rotation only")
    H, dh, V = c.n_heads, c.d_head, c.d_vocab
    hd, R = H * dh, max(lengths)
    qkv = _block0_qkv(W)
    queries = np.arange(V) if queries is None else np.asarray(queries, dtype=np.intp)
    out = np.zeros((len(queries), len(lengths), H))
    for h in range(H):
        q, k = qkv[:, h * dh:(h + 1) * dh], qkv[:, hd + h * dh:hd + (h + 1) * dh]
        for s in range(0, len(queries), chunk):
            sc = _distance_scores(W, q[queries[s:s + chunk]], k, R) / W.scale   # (B, V, R): distance 0..R-1
            own = sc[np.arange(len(sc)), queries[s:s + chunk], 0]
            hi, lo = sc[:, :, 1:].max(axis=1), sc[:, :, 1:].min(axis=1)        # (B, R - 1)
            for col, n in enumerate(lengths):
                top = np.maximum(hi[:, :n - 1].max(axis=1), own)
                e_hi, e_lo, e_own = (np.exp(x - top[:, None]) for x in (hi[:, :n - 1], lo[:, :n - 1], own[:, None]))
                rest = e_own + e_lo.sum(axis=1, keepdims=True) - e_lo
                out[s:s + chunk, col, h] = (e_hi / (e_hi + rest)).max(axis=1)
    return out


def block0_reach(model, lengths, queries=None, caps=None) -> np.ndarray:
    """For each last token q of `queries` and each n of `lengths`: an upper bound (float64) on the move of the
    last row's block-0 attention output that one changed token can cause in an input of length n ending in q:
    per head the weight cap of `block0_weight_caps` times the head's value diameter max ||(v_t - v_s) W_O||
    (the other positions' normalised average is shared by both inputs, so the head's output moves by at most
    the larger weight times a distance between value points), summed over heads. An array (queries, lengths);
    `caps`, if given, is `block0_weight_caps(model, lengths, queries)` already computed."""
    from tcert.generator.model.forward import _weights
    W = _weights(model)
    qkv = _block0_qkv(W)
    diam = [_value_diameter(W, qkv, h) for h in range(W.c.n_heads)]
    caps = block0_weight_caps(model, lengths, queries) if caps is None else caps
    return caps @ np.array(diam)


def reach_context(model, n: int, q: int, d: int = 1) -> np.ndarray:
    """An input of length n ending in q built so that the position at distance d from the end can take the most
    block-0 weight in the last row: at every other distance r the token t minimising sum_h D_h e^(s_h(q, t, r)
    - M_h) (D_h head h's value diameter, M_h the highest score q gives any token at distance d in head h; the
    scores those of `block0_weight_caps`). The position n - 1 - d holds that argmax token of the largest head
    term (the caller re-pairs it)."""
    from tcert.generator.model.forward import _weights
    W = _weights(model)
    c = W.c
    H, dh, V = c.n_heads, c.d_head, c.d_vocab
    hd = H * dh
    qkv = _block0_qkv(W)
    cost, hi = np.zeros((V, n)), []
    for h in range(H):
        sc = _distance_scores(W, qkv[q:q + 1, h * dh:(h + 1) * dh], qkv[:, hd + h * dh:hd + (h + 1) * dh], n)[0]
        sc = sc / W.scale                                                     # (V, n): distance 0..n-1
        diam = _value_diameter(W, qkv, h)
        cost += diam * np.exp(sc - sc[:, d].max())
        hi.append((diam, int(np.argmax(sc[:, d]))))
    tokens = np.argmin(cost, axis=0)[::-1].astype(np.intp)                  # position n - 1 - r holds distance r
    tokens[-1], tokens[n - 1 - d] = q, max(hi)[1]
    return tokens


def _block0_qkv(W):
    """Block 0's queries, keys and values side by side (d_vocab, 3 H d_head) of every token's normalised embedding
    (before any rotation): block 0's rows depend on the token alone."""
    from tcert.generator.model.forward import _ln
    return _ln(W, W.t["embed.W_E"], "blocks.0.ln1") @ W.qkv_w[0] + W.qkv_b[0]


def _value_diameter(W, qkv, h):
    """max over token pairs of ||(v_t - v_s) W_O,h|| for head h of block 0 (`qkv` from `_block0_qkv`), by blocks
    of 64 tokens."""
    H, dh, V = W.c.n_heads, W.c.d_head, W.c.d_vocab
    v = qkv[:, (2 * H + h) * dh:(2 * H + h + 1) * dh] @ W.o_w[0][h * dh:(h + 1) * dh]
    return max(float(np.linalg.norm(v[s:s + 64, None] - v[None], axis=-1).max()) for s in range(0, V, 64))


def _distance_scores(W, q, k, R):
    """Scores q_a . rot(k_t, -r) (unscaled) of each query row a of q (B, dh) against every key row t of k (V, dh)
    at each distance r = 0..R-1 (the key r positions before the query): (B, V, R)."""
    from tcert.generator.model.forward import apply_rotary, rotary_cos_sin
    c = W.c
    if not c.rotary:
        return np.repeat((q @ k.T)[:, :, None], R, axis=2)
    cos, sin = rotary_cos_sin(W, np.arange(R))
    qr = apply_rotary(np.repeat(q[:, None], R, axis=1)[..., None, :], cos, sin, c.rotary_dim,
                      c.rotary_adjacent_pairs)[..., 0, :]                                     # (B, R, dh) at r
    return np.einsum("brd,vd->bvr", qr, k)
