"""Generate `influence` certificates (and the corollary on one input).

Every constant is filled in by the checker's own derivation (`tcert.checker.kinds.influence.certified_needs`)
run with a ledger that *records* each rigorous bound (rounded up by a tiny relative slack) instead of
checking it; the matrices the constants read are folded through the LayerNorm gains and centred, so a float
estimate would have to repeat that work (the checker's time is the generator's time).

  ledger.py     FillLedger: records each constant the derivation asks for
  constants.py  influence_parts / influence_certificate: certify with the checker's derivation, then write
  corollary.py  corollary_certificate: the largest R the checker's movement bound allows on one input
  search.py     adversarial_influence: the worst influence a search finds (tightness, tests); strong_influence:
                the causal search with prefix key/value reuse (prefix_cache, suffix_states, context_ascent)
  search_long.py  long-input searches on that cache (grown_influence, polish_influence, segment_fillers) and
                the measurements of why the worst change falls with n (block0_weight_caps, last_row_weights)
  search_grad.py  greedy coordinate gradient on a torch copy of the forward pass (grad_influence)
  search_flip.py  the LayerNorm flip: a context that makes the last position's block-1 input nearly constant,
                then one change that turns it around (flip_influence, flat_queries)
  models.py     toy_model, robust_toy_model, write_examples (the shipped certificates/influence/)
  cli.py        `tcert influence` and the demo section
"""

from tcert.generator.influence.constants import DEFAULT_POWER, influence_certificate, influence_parts
from tcert.generator.influence.corollary import corollary_certificate
from tcert.generator.influence.models import robust_toy_model, toy_model, write_examples
from tcert.generator.influence.search import adversarial_influence

__all__ = ["DEFAULT_POWER", "adversarial_influence", "corollary_certificate", "influence_certificate",
           "influence_parts", "robust_toy_model", "toy_model", "write_examples"]
