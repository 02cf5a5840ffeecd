"""Max-of-K accuracy certificates, generator side (float, untrusted); mirrors `tcert.checker.kinds.accuracy`.

Modules: `tables` (float EQKE, EQKP, EU, EVOU, PVOU and shared float helpers), `brute`, `cubic`, `subcubic`
(one per strategy), `strategies` (the claim, `make_certificate` for every strategy, the estimate), `cli`.
The entry points other code calls are importable from here.
"""

from tcert.generator.accuracy.brute import brute_count, brute_flops
from tcert.generator.accuracy.cubic import cubic_cases, cubic_flops
from tcert.generator.accuracy.strategies import claim_for, estimate_accuracy, make_certificate
from tcert.generator.accuracy.subcubic import subcubic_evidence, subcubic_flops
from tcert.generator.accuracy.tables import float_tables, tables_flops

__all__ = ["brute_count", "brute_flops", "claim_for", "cubic_cases", "cubic_flops", "estimate_accuracy",
           "float_tables", "make_certificate", "subcubic_evidence", "subcubic_flops", "tables_flops"]
