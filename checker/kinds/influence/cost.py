"""The influence kind's cost estimate (checker/resources.py): per head and MLP the trace-power operator
norms, the row distances of W_E and W_U, the caps over n_max, and the corollary's forward pass."""

from tcert.checker.resources import MATRIX, MATRIX_BYTES, SCALAR_BYTES, Cost, at, count, forward, length


def cost(cfg, claim, evidence):
    """Gram products and 2^power squarings per norm (the MLP's three: W_in, W_out and, for its diameter, their
    product; the heads stacked: H d x d products and their d x d Gram; the joint spread: those again, M W_out, W_out's
    Gram and one d x d Gram sum per block), blockwise row distances, n_max-term caps; for the local claim its forward pass and the
    per-position, per-token rule."""
    d, dh, H, m, v, L = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_mlp or 0, cfg.d_vocab, cfg.n_layers
    p, n_max = count(at(evidence, "power"), 8), count(at(claim, "n_max"), cfg.n_ctx)
    small, big = min(d, m), max(d, m)
    products = L * (H * (8 * dh * dh * d + (p + 2) * 4 * dh ** 3) + 3 * (small * small * big + p * small ** 3))
    products += L * (H * d * d * (dh + d) + p * d ** 3)
    products += L * (H * d * d * (dh + d) + 2 * d * d * m + 8 * d ** 3 + 6 * p * d ** 3)   # spread<k>.joint: 6 Gram sums
    products += 2 * (v + n_max) * 64 * d
    total = Cost(MATRIX * products + L * 6 * n_max + 4 * (v + n_max), MATRIX_BYTES * 4 * (big * big + 64 * d),
                 f"this influence certificate ({L} layer(s), d_model {d}, n_max {n_max}, power {p})")
    tokens = at(claim, "corollary", "prediction", "tokens")
    local = at(claim, "local", "prediction", "tokens")
    if local is not None and L >= 2:   # propagated: ~15 operations per changed position, block, query, head and key;
        n = length(local)                # block 0 every token's score per (query, position) pair; the V x d products
        work = 15 * L * H * n ** 3 + 12 * H * n * n * v + MATRIX * (H * v * d * (d + dh) + L * (H * n * n * d + products))
        return Cost(work, MATRIX_BYTES * (3 * v * d + n * n * v) + SCALAR_BYTES * (H * n * n * v + L * H * n * n),
                    f"this local influence certificate (n = {n}, {L} layers)") + forward(cfg, n)
    if local is not None:   # the local rule: every token's exp-score and its ~20 exact operations per head and position;
        n = length(local)   # per exact change ~6 H d operations and a 1 x d by d x V product; with competitors one
        ex, comp = length(at(claim, "local", "exact_changes")), length(at(claim, "local", "competitors"))
        work = 20 * H * n * v + MATRIX * (2 * H * v * d * dh + ex * d * v + (comp > 0) * H * v * v * d) \
            + 6 * ex * H * d + 8 * H * n * comp   # V x d by d x V product per head (512-row blocks), ~8 per position
        return Cost(work, MATRIX_BYTES * (3 * v * d + ex * v + 8 * 512 * v) + SCALAR_BYTES * (2 * H * v + 2 * H * n * comp),
                    f"this local influence certificate (n = {n})") + forward(cfg, n)
    return total + forward(cfg, length(tokens)) if tokens is not None else total
