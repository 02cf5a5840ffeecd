"""Shared helpers for the overwhelm tests: tiny random neox1l models and an independent 110-bit oracle."""

import itertools
import math

import mpmath
import numpy as np
from hypothesis import strategies as st
from mpmath.ctx_mp import MPContext

from tcert.generator.model.forward import as_model


def tiny_neox1l(seed, d_vocab=6, d_model=8, n_heads=2, d_head=4, rotary_dim=None, adjacent=False,
                qk_scale=0.5, n_ctx=40, near_tie=False, attn_scale=None, d_mlp=8):
    """(tensors, config) of a small random 1-layer GPT-NeoX-style model (shared LN, parallel MLP, RoPE)."""
    r = np.random.default_rng(seed)

    def g(*shape, sc=1.0):
        return r.normal(0.0, sc, shape)

    t = {"embed.W_E": g(d_vocab, d_model), "unembed.W_U": g(d_model, d_vocab, sc=0.5),
         "unembed.b_U": g(d_vocab, sc=0.1),
         "blocks.0.ln1.w": 1 + g(d_model, sc=0.1), "blocks.0.ln1.b": g(d_model, sc=0.1),
         "blocks.0.attn.W_Q": g(n_heads, d_model, d_head, sc=qk_scale),
         "blocks.0.attn.W_K": g(n_heads, d_model, d_head, sc=qk_scale),
         "blocks.0.attn.W_V": g(n_heads, d_model, d_head, sc=0.5),
         "blocks.0.attn.W_O": g(n_heads, d_head, d_model, sc=0.5),
         "blocks.0.attn.b_Q": g(n_heads, d_head, sc=0.1), "blocks.0.attn.b_K": g(n_heads, d_head, sc=0.1),
         "blocks.0.attn.b_V": g(n_heads, d_head, sc=0.1), "blocks.0.attn.b_O": g(d_model, sc=0.1),
         "blocks.0.mlp.W_in": g(d_model, d_mlp, sc=0.5), "blocks.0.mlp.b_in": g(d_mlp, sc=0.1),
         "blocks.0.mlp.W_out": g(d_mlp, d_model, sc=0.5), "blocks.0.mlp.b_out": g(d_model, sc=0.1)}
    if near_tie:  # two output tokens with almost the same unembedding: their logits nearly tie
        t["unembed.W_U"][:, 1] = t["unembed.W_U"][:, 0] + g(d_model, sc=1e-6)
        t["unembed.b_U"][1] = t["unembed.b_U"][0]
    t = {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}
    cfg = dict(n_layers=1, d_model=d_model, n_heads=n_heads, d_head=d_head, d_vocab=d_vocab, n_ctx=n_ctx,
               d_mlp=d_mlp, act_fn="relu", normalization_type="LN", positional_embedding_type="rotary",
               rotary_dim=rotary_dim or d_head, rotary_adjacent_pairs=adjacent, parallel_attn_mlp=True,
               shared_ln=True, final_ln=False, eps="1/100000")
    if attn_scale is not None:
        cfg["attn_scale"] = attn_scale
    return t, cfg


def tiny_neox_real(seed, d_vocab=6, d_model=8, n_heads=2, d_head=4, rotary_dim=2, act_fn="gelu", bias_sc=0.3,
                   ln_f_sc=0.3, **kw):
    """(tensors, config) of a small random real GPT-NeoX block: separate ln1/ln2, final LayerNorm, GELU
    (or act_fn), random nonzero biases everywhere, partial rotary (rotary_dim < d_head by default)."""
    t, cfg = tiny_neox1l(seed, d_vocab=d_vocab, d_model=d_model, n_heads=n_heads, d_head=d_head,
                         rotary_dim=rotary_dim, **kw)
    r = np.random.default_rng(seed + 7919)
    for name in ("unembed.b_U", "blocks.0.attn.b_Q", "blocks.0.attn.b_K", "blocks.0.attn.b_V",
                 "blocks.0.attn.b_O", "blocks.0.mlp.b_in", "blocks.0.mlp.b_out"):
        t[name] = np.asarray(r.normal(0.0, bias_sc, t[name].shape), np.float32)
    t["blocks.0.ln2.w"] = np.asarray(1 + r.normal(0.0, 0.2, d_model), np.float32)
    t["blocks.0.ln2.b"] = np.asarray(r.normal(0.0, 0.2, d_model), np.float32)
    t["ln_final.w"] = np.asarray(1 + r.normal(0.0, ln_f_sc, d_model), np.float32)
    t["ln_final.b"] = np.asarray(r.normal(0.0, ln_f_sc, d_model), np.float32)
    cfg.update(shared_ln=False, final_ln=True, act_fn=act_fn)
    return t, cfg


def model_of(tensors, cfg):
    """An in-memory Model (no file; sha256 empty) for calling the kind's check directly."""
    return as_model(tensors, cfg)


class Oracle:
    """Independent high-precision (mpmath mpf, 110 bits) last-position logits of a 1-layer rotary model.

    Written from the model-format semantics, not from the checker: per-token LN rows, keys, values and
    exp(score) at each (token, position) are memoised, which is exactly the forward pass (nothing depends
    on other positions except through the softmax sums, recomputed per sequence).
    """

    def __init__(self, model, prec=110):
        self.m, self.c, self.prec = model, model.config, prec
        self.mp = MPContext()   # a private context: the global mpmath precision is left alone
        self.mp.prec = prec
        T = model.tensors
        mpf = self.mp.mpf
        self.P = {k: np.vectorize(lambda x: mpf(float(x)), otypes=[object])(v) for k, v in T.items()}
        c = self.c
        self.div = self.mp.sqrt(c.d_head) if c.attn_scale is None else mpf(c.attn_scale.numerator) / c.attn_scale.denominator
        rd = c.rotary_dim
        self.theta = [self.mp.power(mpf(c.rotary_base.numerator) / c.rotary_base.denominator, mpf(-2 * j) / rd)
                      for j in range(rd // 2)]
        half = rd // 2
        self.pairs = [(2 * j, 2 * j + 1) for j in range(half)] if c.rotary_adjacent_pairs else \
            [(j, j + half) for j in range(half)]
        self.memo = {}

    def layer_norm(self, x, name):
        """LayerNorm of the vector x (mpf list) with weights `name`.w/.b."""
        d = len(x)
        mu = self.mp.fsum(x) / d
        var = self.mp.fsum((a - mu) ** 2 for a in x) / d
        s = self.mp.sqrt(var + self.mp.mpf(self.c.eps.numerator) / self.c.eps.denominator)
        w, b = self.P[name + ".w"], self.P[name + ".b"]
        return [(a - mu) / s * w[i] + b[i] for i, a in enumerate(x)]

    def ln(self, tok, name="blocks.0.ln1"):
        key = ("ln", tok, name)
        if key not in self.memo:
            self.memo[key] = self.layer_norm(list(self.P["embed.W_E"][tok]), name)
        return self.memo[key]

    def act(self, x):
        """The MLP activation (relu, exact-erf gelu, or tanh gelu_new) in mpf."""
        mp = self.mp
        if self.c.act_fn == "relu":
            return max(x, 0)
        if self.c.act_fn == "gelu":
            return x * (1 + mp.erf(x / mp.sqrt(2))) / 2
        return x * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (x + mp.mpf(44715) / 10 ** 6 * x ** 3))) / 2

    def proj(self, tok, name, h):
        key = (name, tok, h)
        if key not in self.memo:
            x = self.ln(tok)
            Wm, bm = self.P[f"blocks.0.attn.W_{name}"][h], self.P[f"blocks.0.attn.b_{name}"][h]
            self.memo[key] = [self.mp.fsum(x[i] * Wm[i][e] for i in range(len(x))) + bm[e] for e in range(len(bm))]
        return self.memo[key]

    def rot(self, v, pos):
        out = list(v)
        for j, (i1, i2) in enumerate(self.pairs):
            a = pos * self.theta[j]
            cs, sn = self.mp.cos(a), self.mp.sin(a)
            out[i1] = v[i1] * cs - v[i2] * sn
            out[i2] = v[i2] * cs + v[i1] * sn
        return out

    def residual(self, tokens):
        """The last position's residual stream after the block, before any final LN (list of mpf)."""
        c, mp = self.c, self.mp
        n, q = len(tokens), tokens[-1]
        resid = list(self.P["embed.W_E"][q])
        for h in range(c.n_heads):
            qv = self.rot(self.proj(q, "Q", h), n - 1)
            es, vs = [], []
            for p, t in enumerate(tokens):
                key = ("e", t, p, n, q, h)
                if key not in self.memo:
                    k = self.rot(self.proj(t, "K", h), p)
                    self.memo[key] = mp.exp(mp.fsum(a * b for a, b in zip(qv, k)) / self.div)
                es.append(self.memo[key])
                vs.append(self.proj(t, "V", h))
            Z = mp.fsum(es)
            z = [mp.fsum(e * v[i] for e, v in zip(es, vs)) / Z for i in range(c.d_head)]
            WO = self.P["blocks.0.attn.W_O"][h]
            for i in range(c.d_model):
                resid[i] += mp.fsum(z[e] * WO[e][i] for e in range(c.d_head))
        resid = [r + b for r, b in zip(resid, self.P["blocks.0.attn.b_O"])]
        x = self.ln(q, "blocks.0.ln1" if c.shared_ln else "blocks.0.ln2")
        Win, Wout = self.P["blocks.0.mlp.W_in"], self.P["blocks.0.mlp.W_out"]
        hid = [self.act(mp.fsum(x[i] * Win[i][m] for i in range(c.d_model)) + self.P["blocks.0.mlp.b_in"][m])
               for m in range(c.d_mlp)]
        return [resid[i] + mp.fsum(hid[m] * Wout[m][i] for m in range(c.d_mlp)) + self.P["blocks.0.mlp.b_out"][i]
                for i in range(c.d_model)]

    def logits(self, tokens):
        """The next-token logits at the last position of `tokens` (list of mpf)."""
        c, mp = self.c, self.mp
        resid = self.residual(tokens)
        if c.final_ln:
            resid = self.layer_norm(resid, "ln_final")
        WU = self.P["unembed.W_U"]
        return [mp.fsum(resid[i] * WU[i][j] for i in range(c.d_model)) + self.P["unembed.b_U"][j]
                for j in range(c.d_vocab)]


def free_strings(kind, n_free, multiset, d_vocab):
    """Every free string of the designed set."""
    if kind == "any":
        return itertools.product(range(d_vocab), repeat=n_free)
    return set(itertools.permutations(multiset))


def exhaustive_confirms(model, prefix, query, kind, n_free, multiset, k):
    """(ok, worst gap): every t in T gives argmax k by a margin no 110-bit rounding could fake."""
    orc = Oracle(model)
    worst = math.inf
    for t in free_strings(kind, n_free, multiset, model.config.d_vocab):
        lg = orc.logits(list(prefix) + list(t) + [query])
        gap = min(lg[k] - lg[j] for j in range(len(lg)) if j != k)
        scale = 1 + max(abs(x) for x in lg)
        if not gap > scale * mpmath.mpf(2) ** -80:
            return False, float(gap)
        worst = min(worst, float(gap))
    return True, worst


def verdict(model, cert, backend):
    """'VERIFIED' or 'REJECTED: ...' from verify() of an in-memory certificate on an in-memory model. A model
    built without a file (sha256 "") and its certificate are bound to a digest of its tensors first."""
    import dataclasses
    import hashlib
    from tcert.checker.errors import BadInput, Rejected
    from tcert.checker.verify import verify
    if not model.sha256:
        digest = hashlib.sha256()
        for name in sorted(model.tensors):
            digest.update(name.encode() + b"\0" + model.tensors[name].dtype.str.encode()
                          + repr(model.tensors[name].shape).encode() + model.tensors[name].tobytes())
        model = dataclasses.replace(model, sha256=digest.hexdigest())
        cert = dict(cert, model_sha256=model.sha256)
    try:
        verify(cert, model, backend)
        return "VERIFIED"
    except (Rejected, BadInput) as e:
        return f"REJECTED: {e}"


def draw_question(draw, d_vocab: int, n_fix_choices: list, three_free_up_to: int) -> dict:
    """A random overwhelm question on a d_vocab model (for @st.composite scenarios): a prefix that is one
    repeated token with a drawn fraction of noise positions first, the free kind (any, or perm of a drawn
    multiset), n_free in 1..3 (1..2 when d_vocab > three_free_up_to) and the query."""
    n_fix = draw(st.sampled_from(n_fix_choices))
    dominant = draw(st.integers(0, d_vocab - 1))
    noise = draw(st.lists(st.integers(0, d_vocab - 1), min_size=n_fix, max_size=n_fix))
    mix = draw(st.sampled_from([0, 0.1, 0.5]))   # fraction of prefix positions not the dominant token
    prefix = [noise[i] if i < int(mix * n_fix) else dominant for i in range(n_fix)]
    n_free = draw(st.integers(1, 3 if d_vocab <= three_free_up_to else 2))
    kind = draw(st.sampled_from(["any", "perm", "perm"]))
    multiset = draw(st.lists(st.integers(0, d_vocab - 1), min_size=n_free, max_size=n_free)) if kind == "perm" else None
    return dict(prefix=prefix, query=draw(st.integers(0, d_vocab - 1)), kind=kind, n_free=n_free, multiset=multiset)


def tiny_nope(**kw):
    """A tiny random neox1l model with its positional information removed."""
    tensors, cfg = tiny_neox1l(**kw)
    cfg = dict(cfg, positional_embedding_type="none")
    cfg.pop("rotary_dim")
    return tensors, cfg


@st.composite
def tight_scenarios(draw):
    """A random tiny model plus an overwhelm question (prefixes biased towards one repeated token)."""
    d_vocab = draw(st.integers(3, 6))
    n_heads = draw(st.integers(1, 3))
    d_head = draw(st.sampled_from([2, 4]))
    model_args = dict(seed=draw(st.integers(0, 10 ** 6)), d_vocab=d_vocab, n_heads=n_heads, d_head=d_head,
                      rotary_dim=draw(st.sampled_from([d_head, 2])), adjacent=draw(st.booleans()),
                      qk_scale=draw(st.sampled_from([0.2, 0.5, 1.0])), near_tie=draw(st.integers(0, 9)) == 0,
                      attn_scale=draw(st.sampled_from([None, None, "3/2", "5"])))
    question = draw_question(draw, d_vocab, [0, 1, 4, 8, 20], 4)
    return dict(model_args=model_args, **question, paper=draw(st.sampled_from(["naive", "lp"])),
                relax=draw(st.booleans()), exact_all=draw(st.booleans()))
