"""The overwhelm kind's cost estimate (checker/resources.py): per free length the fixed side (n prefix and
offset terms per head), the allowed tokens' tables (a tokens, CHUNK at a time for naive/lp: a x d
products; table and cheap bound: a H x d x V), the method's own work (lp: n_free^2 costs per head; tight:
per listed competitor and head the separable product over n_free a x a blocks and the assignment costs)
and the sample's forward pass; the weights once; upto: the naive tables once, then each length."""

from tcert.checker.kinds.overwhelm.tables import CHUNK, table_fits
from tcert.checker.resources import MATRIX, MATRIX_BYTES, SCALAR_BYTES, Cost, at, count, forward_pass, length, weights


def cost(cfg, claim, evidence):
    """The weights, then every free length the claim needs (upto N: lengths 0..N, one after the other)."""
    free, n_fix = at(claim, "free"), length(at(claim, "prefix"))
    perm = at(free, "kind") == "perm"
    n_free = length(at(free, "tokens")) if perm else count(at(free, "length"), cfg.n_ctx)
    a = min(n_free, cfg.d_vocab) if perm else cfg.d_vocab
    total = weights(cfg)._replace(what=f"this overwhelm certificate ({n_fix}-token prefix, {n_free} free tokens, "
                                       f"{a} allowed)")
    if at(free, "kind") != "upto":
        return total + one_length(cfg, n_fix, n_free, a, evidence)
    lengths = at(evidence, "lengths")
    lengths = lengths[1:n_free + 1] if isinstance(lengths, list) else []
    steps = forward_pass(cfg, n_fix + 1)
    for L, e in enumerate(lengths, 1):
        steps = steps.then(one_length(cfg, n_fix, L, a, e) if at(e, "method") == "tight" else
                           forward_pass(cfg, n_fix + L + 1) + Cost(cfg.n_heads * (20 * (n_fix + L) + 10 * a), 0))
    for mode in ("norm", "table"):   # the shared naive tables of each value mode in use
        if any(at(e, "method") == "naive" and at(e, "value_bound") == mode for e in lengths):
            total = total + tables(cfg, n_fix, n_free, a, mode)
    return total + steps


def one_length(cfg, n_fix: int, n_free: int, a: int, e) -> Cost:
    """One free length n_free with `a` allowed tokens, checked by evidence `e` (the method's own work)."""
    d, H, V = cfg.d_model, cfg.n_heads, cfg.d_vocab
    if at(e, "method") != "tight":
        lp = Cost(10 * H * (n_free ** 2 + V), 0)
        return tables(cfg, n_fix, n_free, a, at(e, "value_bound")) + lp + forward_pass(cfg, n_fix + n_free + 1)
    k = length(at(e, "exact"))
    products = a * H * d * (V + d) + 3 * d * V + k * H * (n_free * a * a + a * d)
    scalars = a * H * (d + V // 5) + H * n_free * a * (a + k) + 7 * k * H * n_free ** 2
    rows = a * H * (V + d + n_free) + n_free * a * a
    return tables(cfg, n_fix, n_free, a, None) + Cost(MATRIX * products + scalars,
                                                     SCALAR_BYTES * rows + MATRIX_BYTES * (a * H * V + 2 * d * V + d * d))


def tables(cfg, n_fix: int, n_free: int, a: int, mode) -> Cost:
    """The fixed side and the allowed tokens' scores and values (naive/lp: CHUNK tokens at a time, plus the
    value bound of `mode`: table, the centred EVOU extremes; norm, the column norms; None: tight's own)."""
    d, dh, H, V, n = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_vocab, n_fix + n_free + 1
    if mode in ("table", None) and not table_fits(cfg, a):
        return Cost(0, 0)   # the kind refuses a table above MAX_TABLE_ENTRIES before computing it
    products = a * d * H * (n_free + 2 * dh) + (a * H * d * V if mode == "table" else H * dh * d * V if mode else 0)
    scalars = H * n * (6 * dh + 10) + n * (cfg.rotary_dim or 0) * 5 + a * (8 * d + H * (3 * n_free + dh))
    scalars += a * H * V // 5 if mode == "table" else a * H * dh + V * H * dh if mode else 0
    rows = a if mode is None else min(a, CHUNK)
    values = rows * H * V if mode == "table" else rows * H * dh
    return Cost(MATRIX * products + scalars, SCALAR_BYTES * rows * (d + 2 * H * dh + H * n_free) +
                (SCALAR_BYTES + MATRIX_BYTES) * values)
