"""Adversarial search for the largest single-token influence: a lower bound on the true worst case,
against which tightness reports and tests compare the certified bounds."""

import numpy as np


def adversarial_influence(model, n: int, trials: int = 64, greedy_rounds: int = 2, seed: int = 0):
    """Largest (||y - y'||_2, ||p - p'||_1) found over pairs of length-n inputs differing at one position
    i < n-1: random base inputs, then greedy coordinate ascent on the base and the substituted token
    (float64 forward pass; a lower bound on the true worst case, for tightness reports and tests)."""
    from tcert.generator.model.forward import logits, residuals
    cfg = model.config
    rng = np.random.default_rng(seed)
    V = cfg.d_vocab

    # Pairwise differences cost (replacements)^2 * d memory: past 256 tokens, search over a random
    # subset of replacements (still a lower bound on the worst case, which is all a search gives).
    replacements = np.arange(V) if V <= 256 else np.sort(rng.choice(V, size=256, replace=False))

    def measure(base, i):
        """Both quantities, worst over the replacement tokens at position i."""
        batch = np.repeat(base[None], len(replacements), axis=0)
        batch[:, i] = replacements
        y = residuals(model, batch)[-1][:, -1]
        lg = logits(model, batch)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dy = np.sqrt(((y[:, None] - y[None]) ** 2).sum(-1)).max()
        dp = np.abs(p[:, None] - p[None]).sum(-1).max()
        return float(dy), float(dp)

    best_y = best_p = 0.0
    for _ in range(trials):
        base = rng.integers(0, V, n)
        i = int(rng.integers(0, n - 1))
        cur = measure(base, i)
        for _ in range(greedy_rounds):
            others = [pos for pos in range(n) if pos != i]
            for pos in rng.choice(others, size=min(len(others), 8), replace=False):
                cands = rng.choice(V, size=min(V, 6), replace=False)
                for tok in cands:
                    trial = base.copy()
                    trial[pos] = tok
                    val = measure(trial, i)
                    if val[0] > cur[0]:
                        base, cur = trial, val
        best_y, best_p = max(best_y, cur[0]), max(best_p, cur[1])
    return best_y, best_p


def last_states(model, batch, chunk: int = 32):
    """(final residual, next-token distribution) at the last position of each row of `batch` (B, n), float64;
    the last block computes its query at the last position only, in chunks of rows (memory)."""
    from tcert.generator.model.forward import _block, _embed, _unembed, _weights
    W = _weights(model)
    ys = []
    for s in range(0, len(batch), chunk):
        resid = _embed(W, np.asarray(batch[s:s + chunk]))
        for i in range(W.c.n_layers):
            resid = _block(W, i, resid, q_from=resid.shape[1] - 1 if i == W.c.n_layers - 1 else 0)
        ys.append(resid[:, -1])
    y = np.concatenate(ys)
    lg = _unembed(W, y)
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    return y, p / p.sum(axis=1, keepdims=True)


def fragile_tokens(model, count: int) -> np.ndarray:
    """The `count` tokens whose residual entering the last block's first LayerNorm has the smallest centred
    norm when the token is alone (input of length 1): there the LayerNorm's scale 1/sigma is largest, so a small
    move of that residual can turn its normalised output the most. Candidates for the last token of a search."""
    from tcert.generator.model.forward import _block, _embed, _weights
    W = _weights(model)
    resid = _embed(W, np.arange(model.config.d_vocab)[:, None])
    for i in range(W.c.n_layers - 1):
        resid = _block(W, i, resid)
    x = resid[:, 0] - resid[:, 0].mean(axis=1, keepdims=True)
    return np.argsort(np.linalg.norm(x, axis=1), kind="stable")[:count]


def sharp_seeds(model) -> list:
    """Per head of block 0, a pair (f, q): q the token whose query row of block-0 scores over every token's key
    is the widest (positions and rotations ignored), f the key it scores lowest. With f as the filler one
    changed key can take almost all of that head's weight even in long rows: starts for `structured_influence`."""
    from tcert.generator.model.forward import _ln, _weights
    W, cfg = _weights(model), model.config
    H, dh = cfg.n_heads, cfg.d_head
    u = _ln(W, W.t["embed.W_E"], "blocks.0.ln1")
    qkv = u @ W.qkv_w[0] + W.qkv_b[0]   # [queries | keys | values] of every token, heads side by side
    seeds = []
    for h in range(H):
        scores = qkv[:, h * dh:(h + 1) * dh] @ qkv[:, (H + h) * dh:(H + h + 1) * dh].T
        q = int(np.argmax(scores.max(axis=1) - scores.min(axis=1)))
        seeds.append((int(np.argmin(scores[q])), q))
    return seeds


def pair_distances(y, p, every_p: bool = True):
    """(largest ||y_a - y_b||, its (a, b), largest ||p_a - p_b||_1) over the rows of y (B, d) and p (B, V); by
    blocks of rows (memory), each distance computed from the differences (not from a Gram matrix). every_p
    False: the last is ||p_a - p_b||_1 of that pair (B^2 V work saved)."""
    best, where, dp = 0.0, (0, 0), 0.0
    step = max(1, (1 << 23) // (len(y) * max(y.shape[1], p.shape[1])))   # <= 2^23 entries per block
    for s in range(0, len(y), step):
        dy = np.sqrt(((y[s:s + step, None] - y[None]) ** 2).sum(-1))
        a, b = np.unravel_index(np.argmax(dy), dy.shape)
        if dy[a, b] > best:
            best, where = float(dy[a, b]), (s + int(a), int(b))
        if every_p:
            dp = max(dp, float(np.abs(p[s:s + step, None] - p[None]).sum(-1).max()))
    return best, where, (dp if every_p else float(np.abs(p[where[0]] - p[where[1]]).sum()))


def exhaustive_pairs(model, queries, chunk: int = 256):
    """Every single change of a length-2 input (a, q) -> (b, q), for each last token q in `queries` and every
    two tokens a, b: the largest (||y - y'||_2, ||p - p'||_1) and the input (q, a, b) attaining the first. With
    `queries` the whole vocabulary this is the exact worst case at n = 2 (float64); the second number is the
    distributions' distance for that input."""
    V = model.config.d_vocab
    best, best_p, arg = 0.0, 0.0, None
    for q in queries:
        y, p = last_states(model, np.stack([np.arange(V), np.full(V, q)], axis=1), chunk)
        dy, (a, b), dp = pair_distances(y, p, every_p=False)
        if dy > best:
            best, best_p, arg = dy, dp, (int(q), a, b)
    return best, best_p, arg


def structured_influence(model, n: int, starts: int = 4, rounds: int = 2, pool: int = 256, seed: int = 0,
                         queries=None, chunk: int = 32, seeds=(), witness: bool = False, candidates: int = 64):
    """A stronger search than adversarial_influence for long inputs: inputs made of one filler token f,
    a last token q and the changed position i holding a or b. Per start: the worst pair (a, b) over a pool of
    tokens (all pairwise distances of one batch; pool >= d_vocab: every token), then coordinate ascent on f, on
    q and on i, re-pairing after each round. `queries` (e.g. `fragile_tokens`): start s takes its q from
    queries[s % len] and every q round tries them too; `seeds`, pairs (f, q), fix the first starts (e.g. the
    worst input found at another length). Returns the largest (||y - y'||_2, ||p - p'||_1) found (a lower bound
    on the worst case), and with `witness` the input (f, q, i, a, b) attaining the first. `candidates`: values
    tried per f and q round (>= d_vocab: every token). Past 2^28 entries (pool^2 d_vocab) the second number is
    only that of each round's worst pair."""
    rng = np.random.default_rng(seed)
    V = model.config.d_vocab
    best_y = best_p = 0.0
    queries = [] if queries is None else [int(v) for v in queries]

    def pool_of(extra):
        if pool >= V:
            return np.arange(V)
        return np.unique(np.concatenate([rng.choice(V, size=pool, replace=False), extra]).astype(int))

    def pair(f, q, i, cands):
        base = np.full(n, f)
        base[-1] = q
        batch = np.repeat(base[None], len(cands), axis=0)
        batch[:, i] = cands
        y, p = last_states(model, batch, chunk)
        dy, (a, b), dp = pair_distances(y, p, every_p=len(cands) ** 2 * V <= 1 << 28)   # else the worst pair's
        return dy, dp, int(cands[a]), int(cands[b])

    def vary(slot, values, f, q, i, a, b):
        """The best value of one slot ("f", "q" or "i") for the fixed pair (a, b)."""
        rows = []
        for v in values:
            ff, qq, ii = (v if slot == "f" else f), (v if slot == "q" else q), (int(v) if slot == "i" else i)
            for tok in (a, b):
                row = np.full(n, ff)
                row[-1], row[ii] = qq, tok
                rows.append(row)
        y, _ = last_states(model, np.array(rows), chunk)
        d = np.linalg.norm(y[0::2] - y[1::2], axis=1)
        return values[int(np.argmax(d))]

    def some():
        return np.arange(V) if candidates >= V else rng.choice(V, size=candidates, replace=False)

    arg = None
    for s in range(starts):
        f, q, i = int(rng.integers(V)), (queries[s % len(queries)] if queries else int(rng.integers(V))), n - 2
        if s < len(seeds):
            f, q = (int(v) for v in seeds[s])
        dy, dp, a, b = pair(f, q, i, pool_of([]))
        arg = (f, q, i, a, b) if dy > best_y else arg
        best_y, best_p = max(best_y, dy), max(best_p, dp)
        for _ in range(rounds):
            f = int(vary("f", some(), f, q, i, a, b))
            q = int(vary("q", np.unique(np.concatenate([some(), queries, [q]]).astype(int)), f, q, i, a, b))
            i = int(vary("i", np.unique(np.linspace(0, n - 2, min(n - 1, 16)).astype(int)), f, q, i, a, b))
            dy, dp, a, b = pair(f, q, i, pool_of([a, b]))
            arg = (f, q, i, a, b) if dy > best_y else arg
            best_y, best_p = max(best_y, dy), max(best_p, dp)
    return (best_y, best_p, arg) if witness else (best_y, best_p)
