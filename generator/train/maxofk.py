"""`tcert train maxofk`: train a 1-layer attention-only Max-of-K model (needs the torch extra).

Recipe of the compact-proofs reference implementation (MAX_OF_4_CONFIG): TransformerLens-style init
(weights N(0, (0.8/sqrt(d_model))^2)), biases fixed at zero, AdamW (lr 1e-3, betas (0.9, 0.999),
weight decay 0.01), batch 128, 3000 steps, tokens iid uniform, cross-entropy on the last position only.
Training is deterministic on CPU for a given seed; the result is a tcert model file.
"""

import math
import sys
import time

import numpy as np

from tcert.checker.errors import BadInput


def _torch():
    try:
        import torch
    except ImportError:
        raise BadInput("training needs the torch extra: pip install -e '.[train]'") from None
    return torch


def maxofk_config(k: int, d_vocab: int, d_model: int) -> dict:
    """The tcert config of a Max-of-K model (TransformerLens: attn_only, no LN, learned positions)."""
    return {"n_layers": 1, "d_model": d_model, "n_heads": 1, "d_head": d_model, "d_vocab": d_vocab,
            "n_ctx": k, "attn_only": True, "normalization_type": None,
            "positional_embedding_type": "standard", "attention_dir": "causal"}


def train_maxofk(k: int = 4, seed: int = 0, d_vocab: int = 64, d_model: int = 32, steps: int = 3000,
                 batch: int = 128, lr: float = 1e-3, weight_decay: float = 0.01, progress: bool = True):
    """Train a Max-of-K model; return (tensors as float32 numpy arrays, config dict, loss history)."""
    torch = _torch()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # bitwise-reproducible reductions
    gen = torch.Generator().manual_seed(seed)
    std = 0.8 / math.sqrt(d_model)

    def param(*shape):
        return torch.nn.Parameter(torch.randn(*shape, generator=gen) * std)

    p = {"embed.W_E": param(d_vocab, d_model), "pos_embed.W_pos": param(k, d_model),
         "blocks.0.attn.W_Q": param(1, d_model, d_model), "blocks.0.attn.W_K": param(1, d_model, d_model),
         "blocks.0.attn.W_V": param(1, d_model, d_model), "blocks.0.attn.W_O": param(1, d_model, d_model),
         "unembed.W_U": param(d_model, d_vocab)}
    opt = torch.optim.AdamW(list(p.values()), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    mask = torch.tril(torch.ones(k, k, dtype=torch.bool))
    data_gen = torch.Generator().manual_seed(seed + 1)
    history = []
    iterator = range(steps)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(iterator, desc=f"max-of-{k} seed {seed}", file=sys.stderr, mininterval=1.0)
            iterator = bar
        except ImportError:
            pass
    for step in iterator:
        x = torch.randint(0, d_vocab, (batch, k), generator=data_gen)
        y = x.max(dim=1).values
        logits = _forward(torch, p, x, mask, d_model)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
        if bar is not None and step % 100 == 0:
            bar.set_postfix(loss=f"{history[-1]:.4f}")
    tensors = {name: t.detach().numpy().astype(np.float32) for name, t in p.items()}
    tensors.update({"blocks.0.attn.b_Q": np.zeros((1, d_model), np.float32),
                    "blocks.0.attn.b_K": np.zeros((1, d_model), np.float32),
                    "blocks.0.attn.b_V": np.zeros((1, d_model), np.float32),
                    "blocks.0.attn.b_O": np.zeros(d_model, np.float32),
                    "unembed.b_U": np.zeros(d_vocab, np.float32)})
    return tensors, maxofk_config(k, d_vocab, d_model), history


def _forward(torch, p, x, mask, d_model):
    """Last-position logits of the attention-only model (zero biases)."""
    resid = p["embed.W_E"][x] + p["pos_embed.W_pos"][None, : x.shape[1]]
    q = resid[:, -1] @ p["blocks.0.attn.W_Q"][0]
    keys = resid @ p["blocks.0.attn.W_K"][0]
    vals = resid @ p["blocks.0.attn.W_V"][0]
    scores = torch.einsum("bd,bkd->bk", q, keys) / math.sqrt(d_model)
    scores = scores.masked_fill(~mask[-1][None, :], float("-inf"))
    z = torch.einsum("bk,bkd->bd", scores.softmax(dim=-1), vals)
    out = resid[:, -1] + z @ p["blocks.0.attn.W_O"][0]
    return out @ p["unembed.W_U"]


def cmd_train_maxofk(args):
    from tcert.generator.model.files import save_model
    start = time.perf_counter()
    tensors, cfg, history = train_maxofk(k=args.k, seed=args.seed, d_vocab=args.d_vocab, d_model=args.d_model,
                                         steps=args.steps, batch=args.batch)
    sha = save_model(args.out, tensors, cfg)
    tail = history[-100:]
    print(f"trained max-of-{args.k} (d_vocab {args.d_vocab}, seed {args.seed}, {args.steps} steps) in "
          f"{time.perf_counter() - start:.1f} s; mean loss of the last {len(tail)} steps "
          f"{sum(tail) / len(tail):.5f}; wrote {args.out} (sha256 {sha[:16]}...)")


def add_maxofk_command(tsub):
    """Register `tcert train maxofk` under the `train` subparsers."""
    p = tsub.add_parser("maxofk", help="a 1-layer attention-only Max-of-K model, reference recipe")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d-vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_train_maxofk)
