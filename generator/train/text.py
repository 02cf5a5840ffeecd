"""`tcert train text`: a 1-layer neox1l language model trained on English text (needs the torch extra).

The architecture is the overwhelm paper's block: token embedding, one LayerNorm shared by attention
and MLP, parallel residual (resid + attn(LN(resid)) + mlp(LN(resid))), RoPE on all of d_head
(GPT-NeoX rotate-half pairs, base 10000), causal attention scaled by sqrt(d_head), ReLU MLP, no
final LayerNorm, untied unembedding; biases everywhere. `--no-rope`: the same block without any
positional information (config positional_embedding_type "none"; the paper's appendix F). Next-token cross-entropy on every position
of random windows of the training stream (`tcert.generator.train.text_data`), AdamW, linear warm-up then cosine
decay, gradient clipping at 1. Training is deterministic on CPU for a given seed and thread count.
The result is a tcert model file whose config `tokenizer` names its vocabulary.
"""

import csv
import math
import os
import sys
import time

import numpy as np

from tcert.checker.errors import BadInput

from tcert.generator.train import text_data
from tcert.generator.train.maxofk import _torch

EPS = "1/100000"  # LayerNorm epsilon, an exact decimal (the checker reads it as 1/100000 exactly)
ROTARY_BASE = 10000


def neox1l_config(d_vocab, d_model, n_heads, d_mlp, n_ctx, tokenizer, rope=True, n_layers=1) -> dict:
    """The tcert config of the paper's block (TransformerLens field names), repeated n_layers times
    (default 1: the paper's model); rope=False: the appendix-F variant without positional information
    (positional_embedding_type "none")."""
    if d_model % n_heads:
        raise BadInput(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
    d_head = d_model // n_heads
    return {"n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "d_head": d_head, "d_vocab": d_vocab,
            "n_ctx": n_ctx, "d_mlp": d_mlp, "act_fn": "relu", "normalization_type": "LN", "eps": EPS,
            "positional_embedding_type": "rotary" if rope else "none", "rotary_dim": d_head if rope else None,
            "rotary_base": ROTARY_BASE,
            "rotary_adjacent_pairs": False, "parallel_attn_mlp": True, "shared_ln": True,
            "final_ln": False, "attn_only": False, "attention_dir": "causal", "attn_scale": None,
            "tokenizer_name": tokenizer}


def init_params(torch, cfg, gen) -> dict:
    """Parameters named as in the model file: weights N(0, 0.02^2) (W_out scaled by 1/sqrt 2), biases 0, LN w 1."""
    d, v, h, dh, f = cfg["d_model"], cfg["d_vocab"], cfg["n_heads"], cfg["d_head"], cfg["d_mlp"]

    def normal(*shape, std=0.02):
        return torch.nn.Parameter(torch.randn(*shape, generator=gen) * std)

    def zeros(*shape):
        return torch.nn.Parameter(torch.zeros(*shape))

    p = {"embed.W_E": normal(v, d)}
    for i in range(cfg["n_layers"]):   # block 0 first: a 1-layer model draws exactly as before
        b_ = f"blocks.{i}."
        for m in ("W_Q", "W_K", "W_V"):
            p[b_ + "attn." + m] = normal(h, d, dh)
        for b in ("b_Q", "b_K", "b_V"):
            p[b_ + "attn." + b] = zeros(h, dh)
        p[b_ + "attn.W_O"] = normal(h, dh, d)
        p[b_ + "attn.b_O"] = zeros(d)
        p[b_ + "ln1.w"] = torch.nn.Parameter(torch.ones(d))
        p[b_ + "ln1.b"] = zeros(d)
        p[b_ + "mlp.W_in"] = normal(d, f)
        p[b_ + "mlp.b_in"] = zeros(f)
        p[b_ + "mlp.W_out"] = normal(f, d, std=0.02 / math.sqrt(2))
        p[b_ + "mlp.b_out"] = zeros(d)
    p["unembed.W_U"] = normal(d, v)
    p["unembed.b_U"] = zeros(v)
    return p


def rotary_tables(torch, n, rotary_dim, dtype):
    """cos, sin of p * base^(-2j/rotary_dim) for p < n, j < rotary_dim/2, computed in float64."""
    theta = float(ROTARY_BASE) ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    ang = np.arange(n, dtype=np.float64)[:, None] * theta[None, :]
    return torch.tensor(np.cos(ang), dtype=dtype), torch.tensor(np.sin(ang), dtype=dtype)


def _rotate(torch, x, cos, sin):
    """GPT-NeoX rotate-half on x (B, n, H, Dh): pair (j, j + Dh/2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def forward(torch, p, cfg, x):
    """Logits at every position, (B, n) token ids -> (B, n, d_vocab), in the parameters' dtype."""
    F = torch.nn.functional
    dtype = p["embed.W_E"].dtype
    n = x.shape[1]
    resid = p["embed.W_E"][x]
    if cfg["positional_embedding_type"] == "rotary":
        cos, sin = rotary_tables(torch, n, cfg["d_head"], dtype)
    for i in range(cfg["n_layers"]):
        b_ = f"blocks.{i}."
        a = F.layer_norm(resid, (cfg["d_model"],), p[b_ + "ln1.w"], p[b_ + "ln1.b"], eps=1e-5)
        q = torch.einsum("bnd,hdk->bnhk", a, p[b_ + "attn.W_Q"]) + p[b_ + "attn.b_Q"]
        k = torch.einsum("bnd,hdk->bnhk", a, p[b_ + "attn.W_K"]) + p[b_ + "attn.b_K"]
        v = torch.einsum("bnd,hdk->bnhk", a, p[b_ + "attn.W_V"]) + p[b_ + "attn.b_V"]
        if cfg["positional_embedding_type"] == "rotary":
            q, k = _rotate(torch, q, cos, sin), _rotate(torch, k, cos, sin)
        z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=1.0 / math.sqrt(cfg["d_head"]))
        attn = torch.einsum("bhnk,hkd->bnd", z, p[b_ + "attn.W_O"]) + p[b_ + "attn.b_O"]
        mlp = F.relu(a @ p[b_ + "mlp.W_in"] + p[b_ + "mlp.b_in"]) @ p[b_ + "mlp.W_out"]
        resid = resid + attn + mlp + p[b_ + "mlp.b_out"]
    out = resid
    return out @ p["unembed.W_U"] + p["unembed.b_U"]


def prepare_data(vocab, vocab_size, out_path, sources="lee+enwiki"):
    """(train ids, held-out ids, tokenizer string for the config, vocabulary file written or None)."""
    train_docs, held_docs = text_data.split(sources)
    if vocab == "bert":
        tok = text_data.load_vocab_tokenizer(text_data.bert_vocab_path())
        name, written = text_data.BERT_NAME, None
    elif vocab == "small":
        written = os.path.splitext(out_path)[0] + ".vocab.txt"
        tok = text_data.train_small_vocab([t for _, t in train_docs], vocab_size, written)
        name = os.path.basename(written)
    else:
        raise BadInput(f"--vocab must be bert or small, not {vocab!r}")
    train_ids = np.array(text_data.token_stream(tok, train_docs), dtype=np.int64)
    held_ids = np.array(text_data.token_stream(tok, held_docs), dtype=np.int64)
    return train_ids, held_ids, name, tok.get_vocab_size(), written


def lr_at(step, steps, lr, warmup):
    """Linear warm-up over `warmup` steps, then cosine decay to lr/10 at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def held_out_loss(torch, p, cfg, held, seq_len, windows):
    """Mean next-token loss on `windows` evenly spaced windows of the held-out stream (no gradient)."""
    starts = np.linspace(0, len(held) - seq_len - 1, windows).astype(np.int64)
    x = torch.tensor(np.stack([held[s:s + seq_len + 1] for s in starts]))
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, 8):
            xb = x[i:i + 8]
            logits = forward(torch, p, cfg, xb[:, :-1])
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum"))
    return total / (windows * seq_len)


def train_text(out, d_model=64, d_mlp=256, n_heads=4, vocab="small", vocab_size=4096, steps=1000,
               seq_len=128, batch=16, lr=1e-3, weight_decay=0.01, seed=0, threads=1, n_ctx=2048,
               eval_every=100, eval_windows=64, sources="lee+enwiki", curve=None, progress=True, rope=True,
               n_layers=1):
    """Train and save a model to `out`; return (config, history rows, final held-out loss).

    `curve`: path prefix of the loss-curve CSV/PNG (default: `out` without its extension + ".loss").
    History rows: (step, mean train loss since the previous row, held-out loss, tokens seen, seconds).
    """
    torch = _torch()
    from tcert.generator.model.files import save_model
    if seq_len + 1 > n_ctx:
        raise BadInput(f"--seq-len {seq_len} must be below n_ctx {n_ctx}")
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    train_ids, held, tok_name, d_vocab, _ = prepare_data(vocab, vocab_size, out, sources)
    cfg = neox1l_config(d_vocab, d_model, n_heads, d_mlp, n_ctx, tok_name, rope, n_layers)
    gen = torch.Generator().manual_seed(seed)
    p = init_params(torch, cfg, gen)
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    data_gen = torch.Generator().manual_seed(seed + 1)
    train_t = torch.tensor(train_ids)
    offsets = torch.arange(seq_len + 1)
    warmup = max(1, min(100, steps // 10))
    windows = min(eval_windows, max(1, (len(held) - 1) // seq_len))
    curve = curve or os.path.splitext(out)[0] + ".loss"
    os.makedirs(os.path.dirname(os.path.abspath(curve)), exist_ok=True)
    history, running, start = [], [], time.perf_counter()
    csv_file = open(curve + ".csv", "w", newline="")
    writer = csv.writer(csv_file)
    writer.writerow(["step", "train_loss", "heldout_loss", "tokens", "seconds"])

    def record(step):
        held_loss = held_out_loss(torch, p, cfg, held, seq_len, windows)
        train_loss = sum(running) / len(running) if running else float("nan")
        row = (step, train_loss, held_loss, step * batch * seq_len, time.perf_counter() - start)
        history.append(row)
        writer.writerow([row[0], f"{row[1]:.5f}", f"{row[2]:.5f}", row[3], f"{row[4]:.1f}"])
        csv_file.flush()
        running.clear()
        return held_loss

    bar = None
    iterator = range(steps)
    if progress:
        from tqdm import tqdm
        bar = tqdm(iterator, desc=f"text d{d_model} v{d_vocab}", file=sys.stderr, mininterval=2.0)
        iterator = bar
    held_loss = record(0)
    for step in iterator:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        starts = torch.randint(0, len(train_ids) - seq_len - 1, (batch,), generator=data_gen)
        xb = train_t[starts[:, None] + offsets[None, :]]
        logits = forward(torch, p, cfg, xb[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, d_vocab), xb[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            held_loss = record(step + 1)
            if bar is not None:
                bar.set_postfix(train=f"{history[-1][1]:.3f}", held_out=f"{held_loss:.3f}")
    csv_file.close()
    tensors = {name: t.detach().numpy().astype(np.float32) for name, t in p.items()}
    save_model(out, tensors, cfg)
    plot_curve(curve + ".csv", curve + ".png",
               f"{n_layers}-layer neox1l{'' if rope else ' (no positions)'}, d_model {d_model}, vocab {d_vocab}")
    return cfg, history, held_loss


def plot_curve(csv_path, png_path, title):
    """Plot train and held-out loss against training tokens from a curve CSV."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    tokens = [int(r["tokens"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    train = [(t, float(r["train_loss"])) for t, r in zip(tokens, rows) if r["train_loss"] != "nan"]
    ax.plot([t for t, _ in train], [v for _, v in train], label="train (mean since previous point)")
    ax.plot(tokens, [float(r["heldout_loss"]) for r in rows], label="held-out")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def cmd_train_text(args):
    """Run `tcert train text`."""
    start = time.perf_counter()
    cfg, history, held = train_text(
        args.out, d_model=args.d_model, d_mlp=args.d_mlp, n_heads=args.n_heads, vocab=args.vocab,
        vocab_size=args.vocab_size, steps=args.steps, seq_len=args.seq_len, batch=args.batch, lr=args.lr,
        seed=args.seed, threads=args.threads, n_ctx=args.n_ctx, eval_every=args.eval_every,
        eval_windows=args.eval_windows, sources=args.corpus, curve=args.curve, rope=not args.no_rope,
        n_layers=args.n_layers)
    print(f"trained {args.n_layers}-layer neox1l{' without positions' if args.no_rope else ''} (d_model {cfg['d_model']}, {cfg['n_heads']} heads, d_mlp {cfg['d_mlp']}, "
          f"d_vocab {cfg['d_vocab']}, tokenizer {cfg['tokenizer_name']}) for {args.steps} steps in "
          f"{time.perf_counter() - start:.1f} s; last train loss {history[-1][1]:.4f}, held-out loss "
          f"{held:.4f} nats/token; wrote {args.out}")
    return 0


def add_text_command(tsub):
    """Register `tcert train text` under the `train` subparsers."""
    p = tsub.add_parser("text", help="a 1-layer neox1l language model on English text (overwhelm paper)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=1, help="blocks (default 1, the paper's model)")
    p.add_argument("--d-mlp", type=int, default=256)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab", choices=("bert", "small"), default="small",
                   help="bert: BERT uncased WordPiece (30522); small: WordPiece learned on the corpus")
    p.add_argument("--vocab-size", type=int, default=4096, help="size of the small vocabulary")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (results are reproducible per count)")
    p.add_argument("--n-ctx", type=int, default=2048, help="context length declared in the model config")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--corpus", default="lee+enwiki", help="lee, enwiki or lee+enwiki (gensim's test texts)")
    p.add_argument("--no-rope", action="store_true",
                   help="no positional information at all (overwhelm paper appendix F; config positional "
                        "type \"none\")")
    p.add_argument("--curve", default=None, help="path prefix of the loss curve .csv/.png")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_train_text)
