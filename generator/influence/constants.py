"""The influence certificate's claim and constants: certify with the checker's own derivation, then write.

`influence_parts` runs `tcert.checker.kinds.influence.certified_needs` with a FillLedger that records each
constant (the rigorous bound, rounded up); the claim's four bounds are the needs that derivation returns. Nothing of the checker's arithmetic is repeated here.
"""

from tcert.checker.errors import BadInput
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs

from tcert.generator import certificate
from tcert.generator.influence.ledger import FillLedger, round_up

DEFAULT_POWER = 6


def default_rate(cfg) -> str:
    """The rate this family certifies for the model's mask."""
    return "harmonic" if cfg.attention_dir == "causal" and cfg.n_layers > 1 else "inverse"


def influence_parts(model, n_min: int = 2, n_max: int | None = None, power: int = DEFAULT_POWER,
                    backend: str = "flint", ledger: FillLedger | None = None):
    """(claim, evidence, needs) of an influence certificate for `model`; needs as certified_needs returns. `ledger`:
    a FillLedger (subclass) to record the constants with, e.g. one leaving some optional constants out (tests)."""
    cfg = model.config
    n_max = cfg.n_ctx if n_max is None else n_max
    if not 2 <= n_min <= n_max <= cfg.n_ctx:
        raise BadInput(f"need 2 <= n_min <= n_max <= n_ctx = {cfg.n_ctx}")
    ld = FillLedger() if ledger is None else ledger
    need = certified_needs(model, make_backend(backend), ld, n_max, power)
    claim = {"n_min": n_min, "n_max": n_max, "rate": default_rate(cfg)}
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):   # C and C_abs are recorded constants already
        claim[key] = certificate.num(float(need[key] if key in ("C", "C_abs") else round_up(need[key])))
    evidence = {"power": power, "constants": {k: certificate.num(float(v)) for k, v in ld.claimed.items()}}  # doubles: exact hex
    return claim, evidence, need


def influence_certificate(model, n_min: int = 2, n_max: int | None = None, power: int = DEFAULT_POWER):
    """A full influence certificate (envelope included)."""
    claim, evidence, _ = influence_parts(model, n_min, n_max, power)
    return certificate.envelope("influence", model, claim, evidence)
