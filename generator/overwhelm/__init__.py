"""Generate `overwhelm` certificates (checked by tcert.checker.kinds.overwhelm). Modules mirror the checker's:

  claim.py       the claim and the --free specifications
  tables.py      float64 tables shared by every method (fixed side, free scores, centred values)
  assignment.py  the assignment problem in floats (scipy) and exact dual hints
  naive_lp.py    methods naive and lp (`generate`)
  tight.py       method tight (`generate_tight`)
  upto.py        free kind upto (`generate_upto`)
  cli.py         `tcert overwhelm` and the demo section
"""
