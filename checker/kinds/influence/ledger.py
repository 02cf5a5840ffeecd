"""The influence claim, the evidence's ledger of named constants, and the comparisons between them.

Every constant in evidence.constants is a claimed upper bound. The Ledger checks them one obligation
each ("influence: constant <name>"): the recomputed bound, evaluated from the weights and from the
*claimed* values of the constants before it, must not exceed the claimed value. The claim's four
bounds are then compared with what the constants give ("influence: claim C", ...).
"""

from fractions import Fraction
from typing import NamedTuple

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.numbers import on_grid, parse_int, parse_number, show
from tcert.checker.kinds.influence.rates import RATES

CLAIM_BOUNDS = ("C", "C_prob", "C_abs", "C_prob_abs")
MAX_POWER = 8              # trace-power exponent p: 2^8 squarings is already far beyond any use
MAX_CONSTANTS = 100_000


class Claim(NamedTuple):
    """The parsed claim: lengths n_min..n_max, rate name, and the claimed bounds C, C_prob, C_abs, C_prob_abs."""

    n_min: int
    n_max: int
    rate: str
    bounds: dict


class Evidence(NamedTuple):
    """The parsed evidence: trace-power exponent and the named constants."""

    power: int
    constants: dict


def parse_claim(cfg, claim: dict) -> Claim:
    """Validate the claim's shape against the model config (BadInput on any defect)."""
    fields(claim, "claim", {"n_min", "n_max", "rate", *CLAIM_BOUNDS}, {"corollary"})
    n_min = parse_int(claim["n_min"], "claim.n_min", 2, cfg.n_ctx)
    n_max = parse_int(claim["n_max"], "claim.n_max", n_min, cfg.n_ctx)
    if claim["rate"] not in RATES:
        raise BadInput("claim.rate: must be \"inverse\" or \"harmonic\"")
    if claim["rate"] == "inverse" and cfg.attention_dir == "causal" and cfg.n_layers > 1:
        raise BadInput("claim.rate: a causal model with >= 2 layers is certified at the harmonic rate "
                       "H_n^(L-1)/n, not 1/n (docs/influence.md)")
    bounds = {k: parse_number(claim[k], f"claim.{k}") for k in CLAIM_BOUNDS}
    return Claim(n_min, n_max, claim["rate"], bounds)


def parse_evidence(cfg, evidence: dict) -> Evidence:
    """Validate the evidence's shape against the model config (BadInput on any defect)."""
    fields(evidence, "evidence", {"power", "constants"})
    power = parse_int(evidence["power"], "evidence.power", 0, MAX_POWER)
    consts = evidence["constants"]
    if not isinstance(consts, dict) or len(consts) > MAX_CONSTANTS:
        raise BadInput("evidence.constants: must be an object of named numbers")
    # claimed upper bounds, rounded up to the grid of `on_grid` (per-head sums of them stay small)
    consts = {str(k): on_grid(parse_number(v, f"evidence.constants.{k[:40]}"), True) for k, v in consts.items()}
    return Evidence(power, consts)


class Ledger:
    """The certificate's claimed constants; `const` checks one of them as its own obligation.

    The derivation (`tcert.checker.kinds.influence.certified_needs`) asks a ledger for each constant by
    name with a function computing its bound; the generator hands it a ledger that records instead."""

    def __init__(self, claimed: dict, ob):
        self.claimed, self.ob, self.used = claimed, ob, set()

    def const(self, name: str, bound) -> Fraction:
        """Obligation "influence: constant <name>": claimed[name] >= bound() (a Fraction, recorded as figure
        evidence.constants.<name>); return the claimed value."""
        if name not in self.claimed:
            raise BadInput(f"evidence.constants: missing {name!r}")
        self.used.add(name)
        value = self.claimed[name]
        with self.ob.step(f"influence: constant {name}") as fig:
            need = fig[f"evidence.constants.{name}"] = bound()
            self.ob.require(value >= need, f"claimed {show(value)} is below the recomputed bound {show(need)}")
        return value

    def optional(self, name: str, bound) -> Fraction | None:
        """An optional constant: None when the evidence does not name it (the derivation then does without it),
        else checked like every other by `const`."""
        return self.const(name, bound) if name in self.claimed else None

    def require_all_used(self):
        """A constant the derivation never asked for is a malformed certificate, not a weaker one."""
        unused = sorted(set(self.claimed) - self.used)
        if unused:
            raise BadInput(f"evidence.constants: unused name(s) {unused[:4]}")


def require_claim_covers(ob, claim: Claim, needs: dict):
    """Obligations "influence: claim C", ... : each claimed bound is >= its recomputed need (figure claim.<key>)."""
    for key in CLAIM_BOUNDS:
        with ob.step(f"influence: claim {key}") as fig:
            need = fig[f"claim.{key}"] = needs[key]
            ob.require(claim.bounds[key] >= need,
                       f"claimed {key} = {show(claim.bounds[key])} is below the recomputed {show(need)}")
