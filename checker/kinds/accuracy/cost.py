"""The accuracy kind's cost estimate (checker/resources.py): the interval tables, then the strategy's exact
integer work (brute: every input; cubic: O(n v^3); subcubic: O(n v^2) and O(1) per case)."""

from tcert.checker.resources import INTEGER, MATRIX, MATRIX_BYTES, SCALAR_BYTES, Cost, at, length


def cost(cfg, claim, evidence):
    """The tables (v x v interval products, each entry's ends as integers) plus the strategy's integer work."""
    v, n, d, dh = cfg.d_vocab, cfg.n_ctx, cfg.d_model, cfg.d_head
    tables = Cost(MATRIX * (3 * v * d * dh + 2 * v * v * (dh + d)) + 15 * v * (v + n),
                  (MATRIX_BYTES + SCALAR_BYTES) * 6 * v * (v + n))
    strategy, cases = at(evidence, "strategy"), length(at(evidence, "cases"))
    if strategy == "brute":   # the checker itself refuses more than 2^26 inputs before any work
        inputs = v ** n if n * v.bit_length() <= 27 else 1 << 27   # (v^n itself may have millions of digits)
        work = INTEGER * 4 * n * v ** 3 + 0.01 * n * v * min(inputs, 1 << 26)
    elif strategy == "cubic":
        work = INTEGER * (5 * n * v ** 3 + 10 * cases * v)
    else:
        work = INTEGER * (10 * n * v * v + 32 * v * v + 20 * cases) + 10 * v * dh * dh
    return tables + Cost(work, 0, f"this accuracy certificate ({strategy}, d_vocab {v}, n_ctx {n}, {cases} cases)")
