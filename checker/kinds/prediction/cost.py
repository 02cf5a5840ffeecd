"""The prediction kind's cost estimate (checker/resources.py): one forward pass on the claim's tokens."""

from tcert.checker.resources import at, forward, length


def cost(cfg, claim, evidence):
    """The forward pass on claim.tokens (before the claim is validated: only its length is read)."""
    n = length(at(claim, "tokens"))
    return forward(cfg, n)._replace(what=f"this prediction ({cfg.n_layers} layer(s), {n} tokens)")
