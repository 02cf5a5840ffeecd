"""Gradient-guided search for the largest single-token influence ||y - y'||_2 (the final residual at the last
position of two inputs differing at one position): a torch forward pass of the model, differentiable in the
one-hot rows of the input, proposes token swaps (greedy coordinate gradient, GCG); every swap is kept only if
the exact float64 movement of the new pair grows. A lower bound on the true worst case, like search.py's.

torch is an optional dependency (the 'train' extra): it is imported inside the functions that need it.
"""

import math

import numpy as np


# ----------------------------------------------------------------------------- torch forward pass


class TorchWeights:
    """The model's tensors as torch tensors of one dtype (from `forward._weights`: fused, heads repeated for
    grouped queries), with the constants the forward pass needs."""

    def __init__(self, model, dtype=None):
        import torch
        from tcert.generator.model.forward import _weights
        W = _weights(model)
        self.c, self.eps, self.scale = W.c, W.eps, W.scale
        self.dtype = torch.float64 if dtype is None else dtype
        self.t = {k: torch.tensor(v, dtype=self.dtype) for k, v in W.t.items()}
        self.qkv_w = [torch.tensor(w, dtype=self.dtype) for w in W.qkv_w]
        self.qkv_b = [torch.tensor(b, dtype=self.dtype) for b in W.qkv_b]
        self.o_w = [torch.tensor(w, dtype=self.dtype) for w in W.o_w]
        self.theta = torch.tensor(W.theta, dtype=torch.float64) if W.c.rotary else None


def _norm(tw, x, name):
    """LayerNorm / RMSNorm `name` of x (or x itself when the model has none), as `forward._ln`."""
    import torch
    c = tw.c
    if c.has_rms:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + tw.eps) * tw.t[name + ".w"]
    if not c.has_ln:
        return x
    xc = x - x.mean(-1, keepdim=True)
    return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + tw.eps) * tw.t[name + ".w"] + tw.t[name + ".b"]


def _activation(x, name):
    """The MLP's activation, as `forward._act`."""
    import torch
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name == "gelu_new":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "silu":
        return x * torch.sigmoid(x)
    raise ValueError(f"unknown act_fn {name!r}")


def _rotate(tw, x, positions):
    """Rotary rotation of x (B, s, H, dh) at `positions` (s,), as `forward.apply_rotary`."""
    import torch
    c = tw.c
    rd, half = c.rotary_dim, c.rotary_dim // 2
    ang = torch.as_tensor(np.asarray(positions, dtype=np.float64))[:, None] * tw.theta[None]
    cos, sin = torch.cos(ang).to(tw.dtype)[:, None], torch.sin(ang).to(tw.dtype)[:, None]
    if c.rotary_adjacent_pairs:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        r = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., :half], x[..., half:rd]
        r = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([r, x[..., rd:]], dim=-1)


def _keys_values(tw, i, a, m):
    """Keys (rotated) and values (B, s, H, dh) of block i from normalised rows a (B, s, D) at positions m..."""
    c = tw.c
    B, s, _ = a.shape
    H, dh = c.n_heads, c.d_head
    hd = H * dh
    w, bias = tw.qkv_w[i], tw.qkv_b[i]
    k = (a @ w[:, hd:2 * hd] + bias[hd:2 * hd]).reshape(B, s, H, dh)
    v = (a @ w[:, 2 * hd:] + bias[2 * hd:]).reshape(B, s, H, dh)
    return (_rotate(tw, k, np.arange(m, m + s)) if c.rotary else k), v


def _attention(tw, i, a, q_from, cache=None):
    """Attention of block i on normalised rows a (B, s, D) at positions m..m+s-1 behind the cached prefix of
    m positions (`prefix_kv`; None: m = 0), queries from suffix position q_from on: (B, s - q_from, D)."""
    import torch
    c = tw.c
    B, s, _ = a.shape
    H, dh = c.n_heads, c.d_head
    m = 0 if cache is None else cache["m"]
    q = (a[:, q_from:] @ tw.qkv_w[i][:, :H * dh] + tw.qkv_b[i][:H * dh]).reshape(B, s - q_from, H, dh)
    if c.rotary:
        q = _rotate(tw, q, np.arange(m + q_from, m + s))
    k, v = _keys_values(tw, i, a, m)
    if m:
        kc, vc = cache["kv"][i]
        k, v = torch.cat([kc.expand(B, -1, -1, -1), k], 1), torch.cat([vc.expand(B, -1, -1, -1), v], 1)
    scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / tw.scale            # (B, H, nq, m + s)
    if c.attention_dir == "causal":
        mask = torch.as_tensor(np.arange(m + s)[None, :] > np.arange(m + q_from, m + s)[:, None])
        scores = scores.masked_fill(mask, float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v.transpose(1, 2)                   # (B, H, nq, dh)
    return z.transpose(1, 2).reshape(B, s - q_from, H * dh) @ tw.o_w[i] + tw.t[f"blocks.{i}.attn.b_O"]


def _mlp(tw, i, m):
    """The MLP of block i on normalised rows m, as `forward._mlp`."""
    t, p = tw.t, f"blocks.{i}.mlp."
    if tw.c.gated_mlp:
        post = _activation(m @ t[p + "W_gate"], tw.c.act_fn) * (m @ t[p + "W_in"]) + t[p + "b_in"]
        return post @ t[p + "W_out"] + t[p + "b_out"]
    return _activation(m @ t[p + "W_in"] + t[p + "b_in"], tw.c.act_fn) @ t[p + "W_out"] + t[p + "b_out"]


def _block(tw, i, resid, q_from=0, cache=None):
    """Block i on resid (B, s, D) (behind `cache`'s prefix, if any), the result for positions >= q_from, as
    `forward._block`."""
    c, p = tw.c, f"blocks.{i}."
    out = resid[:, q_from:] + _attention(tw, i, _norm(tw, resid, p + "ln1"), q_from, cache)
    if c.attn_only:
        return out
    ln2 = p + ("ln1" if c.shared_ln else "ln2")
    return out + _mlp(tw, i, _norm(tw, resid[:, q_from:] if c.parallel_attn_mlp else out, ln2))


def _positioned(tw, rows, m):
    """Embedded rows (B, s, D) at positions m..m+s-1 with the learned positional embedding added, if any."""
    if tw.c.positional_embedding_type == "standard":
        return rows + tw.t["pos_embed.W_pos"][m:m + rows.shape[1]]
    return rows


def final_states(tw, rows, cache=None):
    """Final residual at the last position (B, D) of the inputs whose embedded rows are `rows` (B, s, D) (token
    embeddings, or any mixture of them: a one-hot (B, s, V) times W_E), behind `cache`'s prefix (`prefix_kv`;
    None: the rows are the whole inputs)."""
    c = tw.c
    s, m = rows.shape[1], 0 if cache is None else cache["m"]
    resid = _positioned(tw, rows, m)
    for i in range(c.n_layers):
        resid = _block(tw, i, resid, s - 1 if i == c.n_layers - 1 else 0, cache)
    return resid[:, -1]


def prefix_kv(tw, prefix):
    """Keys and values of every block at positions 0..m-1 of one token prefix (m,) of a causal model: what any
    input starting with `prefix` shows its later positions (`final_states` reads it as `cache`)."""
    import torch
    c = tw.c
    if c.attention_dir != "causal":
        raise ValueError("prefix_kv needs a causal model (a bidirectional prefix sees the suffix)")
    prefix = torch.as_tensor(np.asarray(prefix, dtype=np.intp).reshape(1, -1))
    kv, m = [], prefix.shape[1]
    with torch.no_grad():
        resid = _positioned(tw, tw.t["embed.W_E"][prefix], 0)
        for i in range(c.n_layers):
            kv.append(_keys_values(tw, i, _norm(tw, resid, f"blocks.{i}.ln1"), 0))
            if i < c.n_layers - 1:
                resid = _block(tw, i, resid)
    return {"m": m, "kv": kv}


# ----------------------------------------------------------------------------- greedy coordinate gradient


def movements(tw, inputs, i, a, b, cache=None, chunk=None):
    """||y_a - y_b||_2 for each row of `inputs` (B, s) with a[k], and with b[k], at position i (of the row)
    behind `cache`'s prefix (`prefix_kv`; None: the rows are whole inputs): torch in tw's dtype, no gradient,
    in chunks of rows bounded by the attention's memory."""
    import torch
    inputs = np.asarray(inputs, dtype=np.intp)
    B, s = inputs.shape
    n = s + (0 if cache is None else cache["m"])
    chunk = chunk or max(1, (1 << 24) // (2 * tw.c.n_heads * s * n))
    out = np.empty(B)
    E = tw.t["embed.W_E"]
    with torch.no_grad():
        for r in range(0, B, chunk):
            xa, xb = inputs[r:r + chunk].copy(), inputs[r:r + chunk].copy()
            xa[:, i], xb[:, i] = a[r:r + chunk], b[r:r + chunk]
            y = final_states(tw, E[torch.as_tensor(np.concatenate([xa, xb]))], cache)
            out[r:r + len(xa)] = (y[:len(xa)] - y[len(xa):]).norm(dim=1).numpy()
    return out


def swap_gains(tw, x, i, a, b, cache=None):
    """The movement ||y_a - y_b|| of the pair (x, i, a, b) (x (s,) behind `cache`'s prefix, i a position of
    x) and its first-order gains: (value, G (s, V), ga (V), gb (V)) with G[j, t] the gradient's prediction of
    the change when x's token j becomes t (both inputs share it; G[i] is -inf), ga[t] / gb[t] that when a / b
    becomes t (differences of the gradient w.r.t. the one-hot rows; zero for the current tokens)."""
    import torch
    V, E = tw.c.d_vocab, tw.t["embed.W_E"]
    x = torch.as_tensor(np.asarray(x, dtype=np.intp))
    hot = torch.nn.functional.one_hot(x, V).to(tw.dtype).requires_grad_()
    ha = torch.nn.functional.one_hot(torch.as_tensor(int(a)), V).to(tw.dtype).requires_grad_()
    hb = torch.nn.functional.one_hot(torch.as_tensor(int(b)), V).to(tw.dtype).requires_grad_()
    r = hot @ E
    rows = torch.stack([torch.cat([r[:i], (h @ E)[None], r[i + 1:]]) for h in (ha, hb)])
    y = final_states(tw, rows, cache)
    value = (y[0] - y[1]).norm()
    value.backward()
    G = hot.grad.numpy().astype(np.float64)
    G -= G[np.arange(len(x)), x.numpy()][:, None]
    G[i] = -np.inf
    ga, gb = (h.grad.numpy().astype(np.float64) for h in (ha, hb))
    return float(value.detach()), G, ga - ga[int(a)], gb - gb[int(b)]


def _proposals(G, ga, gb, x, a, b, batch, topk, swaps, rng):
    """`batch` candidate pairs (inputs (batch, s), a (batch,), b (batch,)) from the first-order gains G: one
    candidate in ten changes a, one b (to one of the `topk` tokens of ga / gb); one in five changes every position
    holding a repeated token f (a filler) to one of the `topk` tokens whose summed gain over those positions is
    largest; the others change `swaps[c % len]` positions, drawn (alternately) with probability proportional to
    their best predicted gain or uniformly, each to one of its `topk` best tokens. Positions with G = -inf stay
    (all of them: every candidate changes a or b)."""
    s, V = G.shape
    topk = min(topk, V)
    x = np.asarray(x)
    top = np.argpartition(-G, topk - 1, axis=1)[:, :topk]
    live = np.isfinite(G.max(axis=1))
    gain = np.where(live, np.maximum(G.max(axis=1), 0.0), 0.0)
    uniform = live / max(1, live.sum())
    weighted = gain / gain.sum() if gain.sum() > 0 else uniform
    tokens, counts = np.unique(x[live], return_counts=True)
    fillers = tokens[counts > 1]
    tops = [np.argpartition(-g, topk - 1)[:topk] for g in (ga, gb)]
    X, A, B = np.repeat(x[None], batch, 0), np.full(batch, a), np.full(batch, b)
    for c in range(batch):
        kind = rng.random() if live.any() else 0.2 * rng.random()    # no position to change: a or b only
        if kind < 0.1:
            A[c] = tops[0][rng.integers(topk)]
        elif kind < 0.2:
            B[c] = tops[1][rng.integers(topk)]
        elif kind < 0.4 and len(fillers):
            where = np.flatnonzero(live & (x == fillers[rng.integers(len(fillers))]))
            summed = G[where].sum(axis=0)
            X[c, where] = np.argpartition(-summed, topk - 1)[:topk][rng.integers(topk)]
        else:
            p = weighted if c % 2 else uniform
            pos = rng.choice(s, size=min(int(swaps[c % len(swaps)]), int(np.count_nonzero(p))), replace=False, p=p)
            X[c, pos] = top[pos, rng.integers(topk, size=len(pos))]
    return X, A, B


def gcg_influence(model, tokens, i, a, b, positions=None, steps: int = 100, batch: int = 64, topk: int = 32,
                  swaps=(1, 2, 4), seed: int = 0, dtype=None, seconds=None, tw=None, trace=None):
    """Greedy coordinate gradient ascent of ||y_a - y_b||_2 over the pair (tokens, i, a, b) with i fixed: per
    step the gradient w.r.t. the one-hot rows ranks every token at every position of `positions` (None: every
    position but i) and the tokens a and b (`swap_gains`), `batch` candidates of `swaps` changes each
    (`_proposals`) are evaluated exactly (torch in `dtype`, default float32) and the best replaces the pair if
    it moves more. Only the positions from min(positions, i) on are recomputed (the prefix's keys and values
    once, `prefix_kv`; causal models). Stops after `steps` steps or `seconds`; `trace` (a list) gets one
    (steps taken, candidates evaluated, candidates accepted) per call. Returns (||y - y'||_2 in float64
    by `search.pair_movement`, tokens, i, a, b): the two inputs are `tokens` with a, and with b, at i."""
    import time

    import torch
    from tcert.generator.influence.search import pair_movement
    tw = tw or TorchWeights(model, torch.float32 if dtype is None else dtype)
    rng = np.random.default_rng(seed)
    x, a, b = np.array(tokens, dtype=np.intp), int(a), int(b)
    n = len(x)
    positions = [j for j in (range(n) if positions is None else positions) if int(j) != i]
    start = min(positions + [i])
    cache = prefix_kv(tw, x[:start]) if start else None
    still = np.setdiff1d(np.arange(start, n), positions) - start     # suffix positions that keep their token
    clock, cur, taken, accepted = time.perf_counter(), None, 0, 0
    for _ in range(steps):
        if seconds is not None and time.perf_counter() - clock > seconds:
            break
        value, G, ga, gb = swap_gains(tw, x[start:], i - start, a, b, cache)
        cur = value if cur is None else cur
        G[still] = -np.inf
        X, A, B = _proposals(G, ga, gb, x[start:], a, b, batch, topk, swaps, rng)
        d = movements(tw, X, i - start, A, B, cache)
        c, taken = int(np.argmax(d)), taken + 1
        if d[c] > cur:
            cur, x[start:], a, b, accepted = float(d[c]), X[c], int(A[c]), int(B[c]), accepted + 1
    if trace is not None:
        trace.append((taken, taken * batch, accepted))
    x[i] = a
    return pair_movement(model, x, i, a, b)[0], x, i, a, b


def grad_influence(model, tokens, i, a, b, window=None, rounds: int = 2, steps: int = 100, batch: int = 64,
                   topk: int = 32, seed: int = 0, seconds=None, dtype=None, trace=None):
    """Refine a pair of inputs (e.g. the witness of `search.strong_influence` or `seeded_influence`; causal
    models): `rounds` times `gcg_influence` over the last `window` positions (None: every position) and then
    the worst pair at i over every token (`search.context_pairs`, float64, the prefix before i reused).
    `seconds` bounds each GCG run; `trace` as in `gcg_influence`. Returns (||y - y'||_2, ||p - p'||_1, tokens,
    i, a, b) of the largest pair found, both recomputed in float64 by `search.pair_movement` (never below the
    start's movement)."""
    import torch
    from tcert.generator.influence.search import context_pairs, pair_movement
    tw = TorchWeights(model, torch.float32 if dtype is None else dtype)
    V, n = model.config.d_vocab, len(tokens)
    x = np.array(tokens, dtype=np.intp)
    x[i] = a
    best = (*pair_movement(model, x, i, a, b), x.copy(), i, int(a), int(b))
    positions = None if window is None else range(max(0, n - window), n)
    for r in range(rounds):
        _, x, i, a, b = gcg_influence(model, x, i, a, b, positions, steps, batch, topk, seed=seed + r,
                                      seconds=seconds, tw=tw, trace=trace)
        _, _, a, b = context_pairs(model, x, i, np.arange(V))
        x[i] = a
        dy, dp = pair_movement(model, x, i, a, b)
        if dy > best[0]:
            best = (dy, dp, x.copy(), i, a, b)
    return best


def relaxed_influence(model, tokens, i, a, b, steps: int = 300, lr: float = 0.1, sharp: float = 4.0,
                      temperatures=(1.0, 0.1), seed: int = 0, dtype=None):
    """Continuous relaxation: every position's token (and the pair a, b at i) becomes a softmax over the
    vocabulary of logits started at `sharp` times the one-hot of `tokens` plus noise; Adam ascends ||y_a - y_b||
    of the mixed embeddings while the softmax temperature falls geometrically through `temperatures`; the
    argmax tokens are the result. Returns (||y - y'||_2 in float64 by `search.pair_movement`, tokens, i, a, b,
    the relaxed movement at the last step): the gap between the last two shows what the rounding loses."""
    import torch
    from tcert.generator.influence.search import pair_movement
    tw = TorchWeights(model, torch.float32 if dtype is None else dtype)
    V, E = model.config.d_vocab, tw.t["embed.W_E"]
    gen = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(np.asarray(tokens, dtype=np.intp))
    start = torch.nn.functional.one_hot(torch.cat([x, torch.as_tensor([int(b)])]), V).to(tw.dtype) * sharp
    start[i, :] = sharp * torch.nn.functional.one_hot(torch.as_tensor(int(a)), V)
    theta = (start + 0.1 * torch.randn(start.shape, generator=gen, dtype=tw.dtype)).requires_grad_()
    opt = torch.optim.Adam([theta], lr=lr)
    t0, t1 = temperatures
    for s in range(steps):
        tau = t0 * (t1 / t0) ** (s / max(1, steps - 1))
        mix = torch.softmax(theta / tau, dim=-1) @ E
        rows = torch.stack([mix[:-1], torch.cat([mix[:i], mix[-1:], mix[i + 1:-1]])])
        y = final_states(tw, rows)
        loss = -(y[0] - y[1]).norm()
        opt.zero_grad()
        loss.backward()
        opt.step()
    pick = theta.detach().argmax(dim=-1).numpy()
    out, a, b = pick[:-1].copy(), int(pick[i]), int(pick[-1])
    return pair_movement(model, out, i, a, b)[0], out, i, a, b, float(-loss.detach())
