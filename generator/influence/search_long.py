"""Combinatorial searches for the worst single-token change at long inputs (causal models), on top of the
key/value reuse of `search.py`: a witness found at a shorter length keeps its tail (the change and the tokens
around it) and gets a new, position-dependent filler before it.

  tail_scan        the movement of f...f + tail for every filler f (the all-f prefix cached once per filler)
  segment_fillers  coordinate ascent over runs of the prefix: each run of positions filled with one token
  wide_ascent      coordinate ascent over many context positions, candidates = the window's own tokens + a sample
  grown_influence  the three in turn, then a new worst pair at the change (every token)
  last_row_weights the block-by-block attention weight of the last position on one position (a sink probe)

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
            cache = prefix_cache(model, tokens[:lo])
            rows = np.repeat(tokens[None, lo:], len(cands), axis=0)
            rows[:, :hi - lo] = cands[:, None]
            d = _moves(model, cache, _pair_rows(rows, i - lo, a, b), chunk)
            k = int(np.argmax(d)) if len(d) else 0
            if len(d) and d[k] > best:
                best, tokens[lo:hi] = float(d[k]), cands[k]
    return best, tokens


def wide_ascent(model, tokens, i: int, a: int, b: int, positions, extra: int = 32, rounds: int = 1,
                seed: int = 0, chunk: int = 64):
    """Coordinate ascent over the context of a fixed changed pair (as `search.context_ascent`) whose candidates
    at each position are every distinct token already in the window (from min(positions, i) on: the witnesses
    found repeat a few tokens) plus `extra` random tokens, so that many positions can be visited at n = 1024.
    Every row recomputes only from min(positions, i) on. Returns (||y_a - y_b||, tokens), never below the
    start's movement."""
    rng = np.random.default_rng(seed)
    V = model.config.d_vocab
    tokens = np.array(tokens, dtype=np.intp)
    positions = [int(j) for j in positions if int(j) != i]
    start = min(positions + [i])
    cache = prefix_cache(model, tokens[:start])
    best = pair_movement(model, tokens, i, a, b)[0]
    for _ in range(rounds):
        for j in positions:
            pool = [tokens[start:], [a, b], rng.choice(V, min(extra, V), replace=False)]
            cands = np.unique(np.concatenate(pool).astype(np.intp))
            rows = np.repeat(tokens[None, start:], len(cands), axis=0)
            rows[:, j - start] = cands
            d = _moves(model, cache, _pair_rows(rows, i - start, a, b), chunk)
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
    for s in range(restarts + 1):
        if s:
            tokens, a, b = best[2].copy(), best[4], best[5]
            tokens[positions] = rng.integers(0, V, len(positions))
        for r in range(rounds):
            _, tokens = wide_ascent(model, tokens, i, a, b, positions, extra, 1, seed + s * rounds + r, chunk)
            dy, dp, a, b = context_pairs(model, tokens, i, np.arange(V), chunk=chunk)
            tokens[i] = a
            if dy > best[0]:
                best = (dy, dp, tokens.copy(), i, a, b)
    return best


def last_row_weights(model, tokens, position: int = 0) -> np.ndarray:
    """The attention weight of the last position on `position`, per block and head (L, H), of one input
    (float64): the check whether `position` is a sink that every later row reads."""
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
        out.append(p[:, position] / p.sum(axis=1))
        resid = _block(W, i, resid)
    return np.array(out)
