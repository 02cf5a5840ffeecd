"""`influence`: one changed non-final token moves an L-layer model's last position by at most C r(n).

claim    {"n_min": int >= 2, "n_max": int <= n_ctx, "rate": "inverse" | "harmonic",
          "C": exact number, "C_prob": exact number, optional "corollary"}
         rate "inverse":  r(n) = 1/n            (bidirectional attention, or a 1-layer model)
         rate "harmonic": r(n) = H_n^(L-1) / n  (any mask; needed for causal models with L >= 2),
                          H_n = 1 + 1/2 + ... + 1/n
         "C_abs", "C_prob_abs": exact numbers (n-independent caps)
         Statement: for every n in [n_min, n_max] and every two inputs of length n that differ at one
         position i < n-1 (0-based; never the last), the final residual at the last position moves by
         ||y - y'||_2 <= min(C r(n), C_abs) and the next-token distribution by
         ||p - p'||_1 <= min(C_prob r(n), C_prob_abs).
         corollary {"prediction": prediction claim, "substitutions": R, "gap_lipschitz": G}:
         additionally, on that input x (length n in range) the greedy next token k is unchanged by ANY
         change of at most R of the positions 0..n-2, because R G lip_final min(C r(n), C_abs) < margin,
         G >= max_j ||W_U[:,k] - W_U[:,j]||.
evidence {"power": p, "embed_center": [d numbers], "unembed_center": [d numbers],
          "constants": {name: exact number}}
         Every named constant is a claimed upper bound that the checker recomputes from the weights
         and from the constants before it (docs/influence.md gives each formula and its proof) and
         requires claimed >= recomputed. All formulas are monotone in their inputs, so recomputing
         from claimed (larger) predecessors is sound. Operator norms are checked by the trace-power
         bound ||W||_2 <= tr((W^T W)^(2^p))^(1/2^(p+1)).

Reading order (one obligation per constant, docs/influence.md):
  ledger.py     parse the claim and evidence; the Ledger: "influence: constant <name>", one obligation each
  norms.py      the rigorous norms the constants are made of (operator norms, row distances)
  rates.py      r(n), H_n and the caps max_m 1/rho_k(m)
  blocks.py     the constants block by block: embedding, then per block LN1, attention heads, MLP, the
                induction step B_k, D_k, E_k, spread_k; then the unembedding
  this file     certified_needs (the derivation) and check: compare the claim ("influence: claim C", ...)
  corollary.py  "influence corollary: ..." on one input (reuses the prediction kind's check_claim)
"""

from tcert.checker.envelope import fields
from tcert.checker.numbers import show
from tcert.checker.kinds.influence.blocks import block, embedding, unembedding
from tcert.checker.kinds.influence.vocabulary import value_sets
from tcert.checker.kinds.influence.corollary import check_corollary
from tcert.checker.kinds.influence.local import check_local
from tcert.checker.kinds.influence.ledger import Claim, Ledger, parse_claim, parse_evidence, require_claim_covers
from tcert.checker.kinds.influence.rates import rate, rate_text

__all__ = ["Ledger", "certified_needs", "check", "rate"]


def certified_needs(model, B, ledger, n_max: int, power: int) -> dict:
    """Derive every constant in dependency order through `ledger`; return the smallest claimable C, C_prob,
    C_abs, C_prob_abs, the final LN's Lipschitz constant lip_final and a function returning the folded
    unembedding M (d x V).

    `ledger.const(name, bound)` returns the value to use for constant `name` (a Fraction): the checker's
    Ledger requires the claimed value >= bound() and returns the claimed one; the generator passes a ledger
    that records a value instead, so its constants are exactly what this derivation accepts."""
    cfg = model.config
    state = embedding(B, ledger, model, n_max)
    finite = value_sets(B, model, state.reach.embeds) if cfg.positional_embedding_type != "standard" else None
    for layer in range(cfg.n_layers):
        state = block(B, ledger, model, layer, state, n_max, power, finite)
    ln, radius, M = unembedding(B, ledger, model, state)
    # ||p - p'||_1 <= 2 <= 2 cap_L r(n); the n-independent caps: the last position moves by <= spread_L
    return {"C": state.elsewhere, "C_prob": min(radius * ln.lip * state.elsewhere, 2 * state.cap),
            "C_abs": state.spread, "C_prob_abs": min(radius * ln.lip * state.spread, 2), "lip_final": ln.lip,
            "unembed": M}


def check(model, claim, evidence, B, ob):
    """Verify an influence certificate (and its corollary, when present)."""
    cfg = model.config
    if isinstance(claim, dict) and "local" in claim:   # one input's own attention pattern (local.py)
        fields(claim, "claim", {"local"})
        fields(evidence, "evidence", set())
        ob.summary = check_local(model, B, ob, claim["local"])
        return
    stated, hints = parse_claim(cfg, claim), parse_evidence(cfg, evidence)
    ledger = Ledger(hints.constants, ob)
    needs = certified_needs(model, B, ledger, stated.n_max, hints.power)
    ledger.require_all_used()
    require_claim_covers(ob, stated, needs)
    ob.summary = summary(cfg, stated)
    if "corollary" in claim:
        ob.summary += check_corollary(model, B, ob, claim["corollary"], stated, needs["lip_final"], needs["unembed"]())


def summary(cfg, stated: Claim) -> str:
    """The verified statement in one line."""
    r, c = rate_text(stated.rate, cfg.n_layers), stated.bounds
    return (f"for n in [{stated.n_min}, {stated.n_max}] ({cfg.attention_dir} attention, {cfg.n_layers} layer(s)), one "
            f"changed non-final token moves the last residual by <= min({show(c['C'])}*{r}, {show(c['C_abs'])}) "
            f"and the output distribution (L1) by <= min({show(c['C_prob'])}*{r}, {show(c['C_prob_abs'])})")
