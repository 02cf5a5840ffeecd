"""The published JSON Schema (docs/certificate.schema.json, Draft 2020-12, one $defs entry per kind) and the
checker's parser, kept in step.

- Every shipped certificate and every certificate the generator writes for the tiny cases (every kind,
  method, strategy and free set the mutation harness covers) is valid.
- Relabelled kinds, each missing required field and each wrong type make a certificate invalid.
- The parser is the authority: no schema-invalid mutant is VERIFIED, and every schema-valid mutant the
  parser refuses as malformed (BadInput) falls under one of the explained reasons in PARSER_ONLY: rules a
  schema cannot state because they depend on the model (d_vocab, n_heads, d_model, n_ctx, final LN) or
  compare fields with each other.
"""

import copy
import json
import random
import re

import jsonschema
import pytest

import tcert.testing.mutation as M
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.verify import verify
from tcert.testing import CERTIFICATES, ROOT

SCHEMA = json.loads((ROOT / "docs" / "certificate.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
SHIPPED = sorted(CERTIFICATES.rglob("*.json"))
KINDS = ("prediction", "overwhelm", "accuracy", "influence")
OPTIONAL = {"lp_duals", "final_ln", "duals", "eu_groups", "corollary", "distribution", "position_weights",
            "max_at_least", "competitors", "exact_changes"}   # the only optional claim/evidence keys
SAMPLE = 40          # structural mutants per tiny case for the agreement test (benchmarks can run them all)

# Why a schema-valid certificate can still be malformed to the parser (BadInput): pattern -> reason.
PARSER_ONLY = {
    r"outside \[": "a range that depends on the model (token ids below d_vocab, n_max <= n_ctx, the claim's "
                   "d_vocab/n_ctx/inputs equal to the model's) or on another field (q <= m, c <= n - 2, cutoff < m, "
                   "the corollary's length within [n_min, n_max])",
    r"must list \d+|must be a list of (d_model|d_head) = |must be a list of two lists|must list evidence for each "
    r"length|must list as many hint vectors|must be a list of \d+ to d_head|must be a list of [^=]+ = \d+ exact numbers":
        "a list length tied to the model (n_heads, d_model, d_head) or to another field (the free length)",
    r"listed twice|is the claimed token|is split twice|overlaps another mixed entry":
        "uniqueness: a case or competitor at most once, never the claimed token; a refine case split one way, "
        "its mixed entries disjoint from each other",
    r"no such position pattern": "a refine position pattern must fit the case (n_ctx, q < m)",
    r"must be positive": "a margin > 0 (a schema cannot compare exact rationals written as strings)",
    r"evidence\.constants: (missing|unused)": "the ledger's constant names follow from the model's layers and heads",
    r"mask: must be": "a cubic case's mask is a non-empty subset of the tokens below m",
    r"harmonic rate": "rate inverse is refused for a causal model with >= 2 layers",
    r"required exactly when the model has a final LayerNorm|only with method lp|only for a perm free set|final "
    r"LayerNorm is certified only|needs a perm free set":
        "a field whose presence depends on the model or on another field",
    r"exceeds n_ctx": "prefix + free string + query longer than the model's n_ctx",
    r"the distribution's total weight is": "a weighted accuracy claim's total_weight equals what its distribution "
                                          "gives the model's d_vocab^n_ctx inputs",
    r"weights must be >= 0 with a common denominator": "position weights are exact rationals >= 0 (a schema "
                                                       "cannot compare exact rationals written as strings)",
    r"unclaimed: (must be a hex string of fillings|a token is not below)": "a refine rule-\"e\" hint's length is "
        "|posmask| tokens per filling at the model's hex width, each token below the group's m",
}


def errors(doc) -> list:
    return [e.message for e in VALIDATOR.iter_errors(doc)]


def invalid(doc) -> bool:
    return not VALIDATOR.is_valid(doc)


# One validator per kind: the schema's oneOf tries all four kinds' definitions, and each one pins `kind` to its
# own name (test_relabelled_kinds_are_invalid), so for a document whose `kind` is left alone the full schema is
# valid exactly when its own kind's definition is. Validating against that one definition is ~4x faster.
KIND_VALIDATORS = {k: jsonschema.Draft202012Validator({key: SCHEMA[key] for key in ("$schema", "$id", "$defs")
                                                       if key in SCHEMA} | {"$ref": f"#/$defs/{k}Certificate"})
                   for k in KINDS}


def invalid_as_kind(doc, kind) -> bool:
    """Schema-invalid, for a document whose `kind` field is `kind` and unmutated."""
    return not KIND_VALIDATORS[kind].is_valid(doc)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """The harness's tiny cases (every kind, method, strategy and claim form: a local influence certificate,
    claim {"local": ...} and evidence {}, among them)."""
    return M.tiny_cases(str(tmp_path_factory.mktemp("schema")))


def test_the_schema_is_draft_2020_12_with_one_definition_per_kind():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert [d["$ref"] for d in SCHEMA["oneOf"]] == [f"#/$defs/{k}Certificate" for k in KINDS]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CERTIFICATES)))
def test_shipped_certificates_are_valid(path):
    doc = json.loads(path.read_text())
    assert doc["kind"] in KINDS and not invalid_as_kind(doc, doc["kind"])


def test_generated_certificates_are_valid(cases):
    kinds = set()
    for case in cases:
        assert errors(case.cert) == [], case.name
        kinds.add((case.kind, case.cert["evidence"].get("method") or case.cert["evidence"].get("strategy")))
    assert {k for k, _ in kinds} == set(KINDS) and len(kinds) >= 8, kinds


def every_certificate(cases):
    """The tiny cases and one shipped certificate of each kind and method or strategy (the small ones: a
    Max-of-4 accuracy certificate lists 6,000 cases, and the tiny cases have every accuracy strategy)."""
    seen, out = set(), [(c.name, c.cert) for c in cases]
    for p in (p for p in SHIPPED if p.stat().st_size < 50_000):
        cert = json.loads(p.read_text())
        ev = cert["evidence"]
        key = (cert["kind"], ev.get("method"), ev.get("strategy"), ev.get("variant"), "eu_groups" in ev)
        if key not in seen:
            seen.add(key)
            out.append((p.name, cert))
    return out


def test_relabelled_kinds_are_invalid(cases):
    for name, cert in every_certificate(cases):
        for kind in KINDS:
            if kind != cert["kind"]:
                assert invalid(dict(cert, kind=kind)), (name, kind)
        assert invalid(dict(cert, kind="bogus")) and invalid(dict(cert, version=2)), name
        # Each kind's definition refuses the others' certificates (what KIND_VALIDATORS relies on).
        assert not invalid_as_kind(cert, cert["kind"]), name
        assert all(invalid_as_kind(cert, k) for k in KINDS if k != cert["kind"]), name


def places(tree, path=()):
    """(path, value) of every object key under `tree`; lists (and objects of more than 8 keys) sampled at their
    first two and last entries."""
    if isinstance(tree, dict):
        keys = sorted(tree)
        for k in keys if len(keys) <= 8 else keys[:2] + keys[-1:]:    # e.g. the influence ledger: a sample
            yield path + (k,), tree[k]
            yield from places(tree[k], path + (k,))
    elif isinstance(tree, list):
        for i in sorted({0, 1, len(tree) - 1} & set(range(len(tree)))):
            yield path + (i,), tree[i]
            yield from places(tree[i], path + (i,))


def dropped(cert, path):
    out = copy.deepcopy(cert)
    del M.get(out, path[:-1])[path[-1]]
    return out


def test_missing_fields_are_invalid(cases):
    """Dropping any key of the envelope, claim or evidence breaks the schema, unless the key is optional
    (the informational sections, statement, and the OPTIONAL claim/evidence keys)."""
    for name, cert in every_certificate(cases):
        for key in ("format", "version", "kind", "model_sha256", "claim", "evidence"):
            assert invalid(dropped(cert, (key,))), (name, key)
        for top in ("claim", "evidence"):
            for path, _ in places(cert[top], (top,)):
                if isinstance(path[-1], str) and "constants" not in path[:-1]:   # ledger names: PARSER_ONLY
                    assert invalid_as_kind(dropped(cert, path), cert["kind"]) != (path[-1] in OPTIONAL), (name, path)


def wrong_types(value) -> list:
    """Values of a JSON type the schema never allows where `value` sits (an integer may stand for an exact
    number string, so it is not offered for one)."""
    out = [True, 0.5, {}, [], "x!"]
    if not (isinstance(value, str) and M.is_number(value)):
        out.append(7)
    same = {bool: [True], float: [0.5], dict: [{}], list: [[]], str: ["x!"], int: [7]}.get(type(value), [])
    return [v for v in out if not any(v is s or (type(v) is type(s) and v == s) for s in same)]


def shape(cert, path, value) -> tuple:
    """What decides which part of the schema a value meets: the certificate's kind and method or strategy,
    the value's path with list indices past a pair's generalised, and its JSON type. Places of one shape
    (the same field in two certificates of one method, a list's last entry in two certificates) are checked
    once."""
    ev = cert["evidence"]
    general = tuple(p if isinstance(p, str) or p < 2 else "*" for p in path)
    return (cert["kind"], ev.get("method"), ev.get("strategy"), ev.get("variant"), general, type(value).__name__,
            isinstance(value, str) and M.is_number(value))


def test_wrong_types_are_invalid(cases):
    seen = set()
    for name, cert in every_certificate(cases):
        for top in ("claim", "evidence"):
            for path, value in places(cert[top], (top,)):
                if isinstance(path[-1], str) and path[-1] in ("constants",):
                    continue    # the ledger: any names, each an exact number (tested at its entries)
                if shape(cert, path, value) in seen:
                    continue
                seen.add(shape(cert, path, value))
                for bad in wrong_types(value):
                    if isinstance(value, (dict, list)) and isinstance(bad, (dict, list)) and not value:
                        continue
                    assert invalid_as_kind(M.put(cert, path, bad), cert["kind"]), (name, path, bad)


def classify(cert, model_path) -> str:
    try:
        verify(cert, model_path, "flint")
        return "VERIFIED"
    except Rejected:
        return "REJECTED"
    except BadInput as e:
        return "BadInput: " + str(e)


def structural_mutants(case, rng):
    """The harness's structural mutants (every family but ulp-sized number moves), and wrong types."""
    ms = [m.cert for m in M.mutants(case.cert) if m.family != "numeric" or m.move.startswith(("int", "sign"))]
    for top in ("claim", "evidence"):
        for path, value in places(case.cert[top], (top,)):
            ms += [M.put(case.cert, path, bad) for bad in wrong_types(value)]
    rng.shuffle(ms)
    return ms[:SAMPLE]


def test_schema_and_parser_agree(cases):
    """No schema-invalid mutant is VERIFIED; each schema-valid one the parser calls malformed is explained."""
    rng, unexplained, tally = random.Random(15), [], {"schema-invalid": 0, "explained": 0}
    for case in cases:
        for cert in structural_mutants(case, rng):
            verdict, valid = classify(cert, case.model_path), not invalid(cert)
            if not valid:
                tally["schema-invalid"] += 1
                assert verdict != "VERIFIED", (case.name, cert)
            elif verdict.startswith("BadInput"):
                if any(re.search(p, verdict) for p in PARSER_ONLY):
                    tally["explained"] += 1
                else:
                    unexplained.append((case.name, verdict))
    assert not unexplained, unexplained[:5]
    assert tally["schema-invalid"] > 100 and tally["explained"] > 20, tally
