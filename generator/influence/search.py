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


# ----------------------------------------------------------------------------- causal key/value reuse
# In a causal model a change at position i leaves every position < i untouched in every block, so their keys
# and values can be computed once (`prefix_cache`) and each candidate input only recomputes its suffix
# (`suffix_states`): at n = 1024 with the change at n - 2 a candidate costs two positions, not 1,024.


def _keys_values(W, i, a, start):
    """Keys and values (B, s, H, d_head) of block i from normalised input a (B, s, D) at positions
    start..start+s-1, keys rotated as `_attention` rotates them (heads repeated for grouped queries)."""
    from tcert.generator.model.forward import apply_rotary, rotary_cos_sin
    c = W.c
    B, s, _ = a.shape
    hd = c.n_heads * c.d_head
    k = (a @ W.qkv_w[i][:, hd:2 * hd] + W.qkv_b[i][hd:2 * hd]).reshape(B, s, c.n_heads, c.d_head)
    v = (a @ W.qkv_w[i][:, 2 * hd:] + W.qkv_b[i][2 * hd:]).reshape(B, s, c.n_heads, c.d_head)
    if c.rotary:
        cos, sin = rotary_cos_sin(W, np.arange(start, start + s))
        k = apply_rotary(k, cos, sin, c.rotary_dim, c.rotary_adjacent_pairs)
    return k, v


def prefix_cache(model, prefix) -> dict:
    """The keys and values of every block at positions 0..m-1 of one input prefix (m,) of a causal model:
    what any input starting with `prefix` shows its later positions (float64, `suffix_states` reads it)."""
    from tcert.generator.model.forward import _block, _embed, _ln, _weights
    W = _weights(model)
    c = W.c
    if c.attention_dir != "causal":
        raise ValueError("prefix_cache needs a causal model (a bidirectional prefix sees the suffix)")
    prefix = np.asarray(prefix, dtype=np.intp).reshape(1, -1)
    m = prefix.shape[1]
    if m == 0:
        empty = np.zeros((0, c.n_heads, c.d_head))
        return {"m": 0, "kv": [(empty, empty)] * c.n_layers}
    resid, kv = _embed(W, prefix), []
    for i in range(c.n_layers):
        k, v = _keys_values(W, i, _ln(W, resid, f"blocks.{i}.ln1"), 0)
        kv.append((k[0], v[0]))
        if i < c.n_layers - 1:
            resid = _block(W, i, resid)
    return {"m": m, "kv": kv}


def _cached_attention(W, i, a, cache, q_from):
    """Attention of block i for suffix rows a (B, s, D) at positions m.. behind the cached prefix; queries
    only for suffix positions >= q_from. Returns (B, s - q_from, D), as `_attention` on the whole input."""
    from tcert.generator.model.forward import apply_rotary, rotary_cos_sin
    c, m = W.c, cache["m"]
    B, s, _ = a.shape
    H, dh = c.n_heads, c.d_head
    k, v = _keys_values(W, i, a, m)
    q = (a[:, q_from:] @ W.qkv_w[i][:, :H * dh] + W.qkv_b[i][:H * dh]).reshape(B, s - q_from, H, dh)
    if c.rotary:
        cos, sin = rotary_cos_sin(W, np.arange(m + q_from, m + s))
        q = apply_rotary(q, cos, sin, c.rotary_dim, c.rotary_adjacent_pairs)
    q = q.transpose(0, 2, 1, 3)                                          # (B, H, nq, dh)
    kc, vc = cache["kv"][i]
    own = np.matmul(q, k.transpose(0, 2, 3, 1)) / W.scale                # (B, H, nq, s)
    own = np.where(np.arange(s)[None, :] > np.arange(q_from, s)[:, None], -np.inf, own)
    scores = np.concatenate([np.matmul(q, kc.transpose(1, 2, 0)) / W.scale, own], axis=-1)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    z = np.matmul(p[..., :m], vc.transpose(1, 0, 2)) + np.matmul(p[..., m:], v.transpose(0, 2, 1, 3))
    z = z.transpose(0, 2, 1, 3).reshape(B, s - q_from, H * dh)
    return z @ W.o_w[i] + W.t[f"blocks.{i}.attn.b_O"]


def _cached_block(W, i, resid, cache, q_from):
    """Block i on suffix rows resid (B, s, D) behind the cached prefix, as `forward._block` on the whole input."""
    from tcert.generator.model.forward import _ln, _mlp
    p = f"blocks.{i}."
    out = resid[:, q_from:] + _cached_attention(W, i, _ln(W, resid, p + "ln1"), cache, q_from)
    if W.c.attn_only:
        return out
    ln2 = p + ("ln1" if W.c.shared_ln else "ln2")
    return out + _mlp(W, i, _ln(W, resid[:, q_from:] if W.c.parallel_attn_mlp else out, ln2))


def suffix_states(model, cache, suffixes, chunk: int = 256):
    """(final residual, next-token distribution) at the last position of each input prefix + suffix, for the
    rows of `suffixes` (B, s) behind the prefix of `cache` (`prefix_cache`): `last_states` of the whole inputs,
    computing positions >= m only."""
    from tcert.generator.model.forward import _unembed, _weights
    W = _weights(model)
    suffixes = np.asarray(suffixes, dtype=np.intp)
    m, s = cache["m"], suffixes.shape[1]
    if s < 1 or m + s > W.c.n_ctx:
        raise ValueError(f"suffix of {s} positions behind {m}: need 1 <= s and m + s <= n_ctx")
    ys = []
    for r in range(0, len(suffixes), chunk):
        resid = W.t["embed.W_E"][suffixes[r:r + chunk]]
        if W.c.positional_embedding_type == "standard":
            resid = resid + W.t["pos_embed.W_pos"][m:m + s]
        for i in range(W.c.n_layers):
            resid = _cached_block(W, i, resid, cache, s - 1 if i == W.c.n_layers - 1 else 0)
        ys.append(resid[:, -1])
    y = np.concatenate(ys)
    lg = _unembed(W, y)
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    return y, p / p.sum(axis=1, keepdims=True)


def cache_head(cache, m: int) -> dict:
    """The cache of the first m positions of `cache`'s prefix (a prefix of a prefix: the same keys and values)."""
    if not 0 <= m <= cache["m"]:
        raise ValueError(f"cache of {cache['m']} positions has no head of {m}")
    return {"m": m, "kv": [(k[:m], v[:m]) for k, v in cache["kv"]]}


def context_pairs(model, tokens, i, cands, cache=None, chunk: int = 256):
    """The worst pair (a, b) of tokens from `cands` at position i of the causal input `tokens` (the others
    fixed): (||y_a - y_b||_2, ||p_a - p_b||_1 of that pair, a, b), all pairwise distances of one batch;
    `cache` (of tokens[:i] or longer) is reused."""
    tokens, cands = np.asarray(tokens, dtype=np.intp), np.asarray(cands, dtype=np.intp)
    cache = prefix_cache(model, tokens[:i]) if cache is None else cache_head(cache, i)
    rows = np.repeat(tokens[None, i:], len(cands), axis=0)
    rows[:, 0] = cands
    y, p = suffix_states(model, cache, rows, chunk)
    dy, (a, b), dp = pair_distances(y, p, every_p=False)
    return dy, dp, int(cands[a]), int(cands[b])


def pair_movement(model, tokens, i, a, b):
    """(||y - y'||_2, ||p - p'||_1) of the two inputs `tokens` with a, and with b, at position i (float64)."""
    rows = np.repeat(np.asarray(tokens, dtype=np.intp)[None], 2, axis=0)
    rows[:, i] = a, b
    y, p = last_states(model, rows)
    return float(np.linalg.norm(y[0] - y[1])), float(np.abs(p[0] - p[1]).sum())


def low_keys(model, q, count: int) -> np.ndarray:
    """Fillers for last token q: per head of block 0, the tokens whose keys q's query scores lowest (positions
    and rotations ignored), taken in turn from each head's ranking until `count` distinct tokens. Beside such
    fillers one changed key can take most of a head's weight in a long row."""
    from tcert.generator.model.forward import _ln, _weights
    W, cfg = _weights(model), model.config
    H, dh = cfg.n_heads, cfg.d_head
    u = _ln(W, W.t["embed.W_E"], "blocks.0.ln1")
    qkv = u @ W.qkv_w[0] + W.qkv_b[0]
    ranks = [np.argsort(qkv[:, (H + h) * dh:(H + h + 1) * dh] @ qkv[q, h * dh:(h + 1) * dh], kind="stable")
             for h in range(H)]
    out = []
    for t in np.stack(ranks, axis=1).reshape(-1):
        if int(t) not in out:
            out.append(int(t))
        if len(out) == count:
            break
    return np.array(out, dtype=np.intp)


def constructed_influence(model, n, queries, fillers_per_query: int = 4, offsets=(2, 3, 5, 9), pool=None,
                          seed: int = 0, chunk: int = 256, keep: int = 4):
    """Inputs built to let one changed token dominate attention: filler f everywhere (f among `low_keys` of q),
    last token q (each of `queries`), the changed position i = n - o for o in `offsets`, and the worst pair
    there over `pool` tokens (None: every token) with the prefix's keys and values reused. Returns the `keep`
    largest as (||y - y'||_2, ||p - p'||_1, tokens, i, a, b), largest first (causal models)."""
    rng = np.random.default_rng(seed)
    V = model.config.d_vocab
    found = []
    for q in queries:
        for f in low_keys(model, int(q), fillers_per_query):
            base = np.full(n, int(f), dtype=np.intp)
            base[-1] = int(q)
            cache = prefix_cache(model, base[:n - min(offsets)])
            for o in offsets:
                if not 2 <= o <= n:
                    continue
                cands = np.arange(V) if pool is None or pool >= V else np.sort(rng.choice(V, pool, replace=False))
                dy, dp, a, b = context_pairs(model, base, n - o, cands, cache, chunk)
                found.append((dy, dp, base.copy(), n - o, a, b))
    found.sort(key=lambda r: -r[0])
    return found[:keep]


def context_ascent(model, tokens, i, a, b, positions, candidates=None, rounds: int = 1, seed: int = 0,
                   chunk: int = 256):
    """Coordinate ascent over the context of a fixed changed pair: for each position j in `positions` (j != i)
    in turn, the token there (among `candidates` random tokens and the current one; None: every token) that
    makes ||y_a - y_b|| largest for the inputs `tokens` with a, and with b, at i; every row recomputes only
    the positions from min(positions, i) on. Returns (||y_a - y_b||, tokens), the value never below the start."""
    rng = np.random.default_rng(seed)
    V = model.config.d_vocab
    tokens = np.array(tokens, dtype=np.intp)
    positions = [int(j) for j in positions if int(j) != i]
    start = min(positions + [i])
    cache = prefix_cache(model, tokens[:start])
    best = None
    for _ in range(rounds):
        for j in positions:
            cands = np.arange(V) if candidates is None or candidates >= V else rng.choice(V, candidates, replace=False)
            cands = np.unique(np.append(cands, tokens[j]))
            rows = np.repeat(tokens[None, start:], 2 * len(cands), axis=0)
            rows[:, j - start] = np.repeat(cands, 2)
            rows[:, i - start] = np.tile([a, b], len(cands))
            y, _ = suffix_states(model, cache, rows, chunk)
            d = np.linalg.norm(y[0::2] - y[1::2], axis=1)
            k = int(np.argmax(d))
            if best is None or d[k] > best:
                best, tokens[j] = float(d[k]), cands[k]
    return best, tokens


def strong_influence(model, n, starts=None, offset: int = 2, depth: int = 8, rounds: int = 2, pool=None,
                     seed: int = 0, chunk: int = 256):
    """The strongest search here, for causal models and long inputs: per start (f, q) (default: `sharp_seeds`
    and each of the 4 most `fragile_tokens` q with its first `low_keys` filler) the input f...f q, the changed
    position i = n - offset and its worst pair over `pool` tokens (None: every token), then `rounds` of
    `context_ascent` over the last token and the `depth` positions before i (every token tried) and a new
    worst pair at i. Every candidate recomputes only the positions from i - depth on (`prefix_cache`).
    Returns (||y - y'||_2, ||p - p'||_1, tokens, i, a, b) of the largest found: the two inputs are `tokens`
    with a, and with b, at i (a lower bound on the worst case)."""
    V = model.config.d_vocab
    if starts is None:
        starts = list(sharp_seeds(model)) + [(int(low_keys(model, int(q), 1)[0]), int(q))
                                             for q in fragile_tokens(model, 4)]
    rng = np.random.default_rng(seed)
    i = n - offset
    if not 0 <= i < n - 1:
        raise ValueError(f"offset {offset}: the changed position must be a non-final one of n = {n}")
    positions = [n - 1] + [j for j in range(i + 1, n - 1)] + list(range(i - 1, max(-1, i - 1 - depth), -1))
    best = (0.0, 0.0, None, i, 0, 0)
    for f, q in starts:
        tokens = np.full(n, int(f), dtype=np.intp)
        tokens[-1] = int(q)
        cands = np.arange(V) if pool is None or pool >= V else np.sort(rng.choice(V, pool, replace=False))
        dy, dp, a, b = context_pairs(model, tokens, i, cands, chunk=chunk)
        for r in range(rounds):
            _, tokens = context_ascent(model, tokens, i, a, b, positions, seed=seed + r, chunk=chunk)
            dy, dp, a, b = context_pairs(model, tokens, i, np.arange(V) if pool is None else
                                         np.unique(np.concatenate([cands, [a, b]])), chunk=chunk)
        if dy > best[0]:
            best = (dy, dp, tokens.copy(), i, a, b)
    return best


# ----------------------------------------------------------------------------- long inputs from n = 2 pairs
# The exhaustive n = 2 search finds the worst pairs (q, a, b); `seeded_influence` carries them to length n:
# a filler f before them (every token tried, the one that keeps the movement largest), then `context_ascent`.


def pair_table(model, queries, chunk: int = 256) -> list:
    """For each last token q in `queries`: the worst pair (a, b) of the length-2 inputs (a, q), (b, q) over
    every two tokens (float64). Rows (||y_a - y_b||_2, q, a, b), largest first (`exhaustive_pairs` keeps only
    the first row)."""
    V = model.config.d_vocab
    rows = []
    for q in queries:
        y, p = last_states(model, np.stack([np.arange(V), np.full(V, int(q))], axis=1), chunk)
        dy, (a, b), _ = pair_distances(y, p, every_p=False)
        rows.append((dy, int(q), int(a), int(b)))
    return sorted(rows, key=lambda r: -r[0])


def filler_scan(model, n: int, pairs, fillers=None, chunk: int = 256) -> np.ndarray:
    """Movements ||y_a - y_b||_2 of the inputs f...f a q and f...f b q (length n, the change at n - 2), for every
    filler f of `fillers` (None: every token) and every (q, a, b) of `pairs`: an array (fillers, pairs). The
    all-f prefix is computed once per filler (`prefix_cache`), the pairs behind it together."""
    V = model.config.d_vocab
    fillers = np.arange(V) if fillers is None else np.asarray(fillers, dtype=np.intp)
    if n < 3:
        raise ValueError(f"filler_scan needs n >= 3 (a filler before the pair), not {n}")
    rows = np.array([[t, q] for q, a, b in pairs for t in (a, b)], dtype=np.intp).reshape(-1, 2)
    out = np.zeros((len(fillers), len(pairs)))
    for k, f in enumerate(fillers):
        y, _ = suffix_states(model, prefix_cache(model, np.full(n - 2, int(f))), rows, chunk)
        out[k] = np.linalg.norm(y[0::2] - y[1::2], axis=1)
    return out


def seeded_influence(model, n: int, pairs, keep: int = 4, depth: int = 8, rounds: int = 2, fillers=None,
                     seed: int = 0, chunk: int = 256):
    """Long inputs grown from n = 2 pairs (causal models): for each (q, a, b) of `pairs` (e.g. the first rows of
    `pair_table`, without the movement) the best filler by `filler_scan`; the `keep` best (pair, filler) inputs
    f...f a q then get `rounds` of `context_ascent` over the last token and the `depth` positions before the
    change (every token tried) and a new worst pair at n - 2 over every token. Returns (||y - y'||_2,
    ||p - p'||_1, tokens, i, a, b) of the largest found (the two inputs: `tokens` with a, and with b, at i)."""
    V = model.config.d_vocab
    pairs = [tuple(int(v) for v in p) for p in pairs]
    scan = filler_scan(model, n, pairs, fillers, chunk)
    fill = np.arange(V) if fillers is None else np.asarray(fillers, dtype=np.intp)
    best_f = scan.argmax(axis=0)
    order = np.argsort(-scan.max(axis=0), kind="stable")[:keep]
    i = n - 2
    positions = [n - 1] + list(range(i - 1, max(-1, i - 1 - depth), -1))
    best = (0.0, 0.0, None, i, 0, 0)
    for k in order:
        q, a, b = pairs[k]
        tokens = np.full(n, int(fill[best_f[k]]), dtype=np.intp)
        tokens[-1], tokens[i] = q, a
        dy, dp = pair_movement(model, tokens, i, a, b)
        for r in range(rounds):
            _, tokens = context_ascent(model, tokens, i, a, b, positions, seed=seed + r, chunk=chunk)
            dy, dp, a, b = context_pairs(model, tokens, i, np.arange(V), chunk=chunk)
        if dy > best[0]:
            best = (dy, dp, tokens.copy(), i, a, b)
    return best
