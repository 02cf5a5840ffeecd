"""The auditor's kit beside the checker (installed as `tcert.audit`): what a person files after a check.

`describe`: the model's architecture summary, parameter count and provenance (informational fields the
generator writes into certificates and the report shows). `report`: the audit report of one check, as one
self-contained HTML page or Markdown. Nothing here decides a verdict: `tcert-check` computes its verdict
with `tcert.checker.verify` first and only then hands the record to the report. This package imports the
standard library and `tcert.checker` only (tests/checker/test_trusted_base.py).
"""
