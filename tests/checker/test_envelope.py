"""The certificate envelope and the exact-number parser: accepted forms, refused forms, and every
documented limit (docs/certificate-envelope.md) tested at the limit and one past it. Also the JSON
Schema in docs/ against generated certificates and envelope violations.
"""

import json
import os
import time
from fractions import Fraction

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker import envelope, numbers as exact
from tcert.checker.envelope import parse_certificate_bytes
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int, parse_number
from tcert.generator.certificate import format_number
from tcert.testing import ROOT, example_scale
from tcert.testing.envelope import ENVELOPE_ERRORS, cert, raw

def fuzz_examples(ci: int) -> int:
    """Examples per fuzz test: the CI size, 10x under the large profile, or TCERT_FUZZ_EXAMPLES."""
    return int(os.environ.get("TCERT_FUZZ_EXAMPLES", example_scale(ci)))


SCHEMA = json.loads((ROOT / "docs" / "certificate.schema.json").read_text())


def bad(data: bytes, fragment: str = ""):
    """Assert the bytes are refused with BadInput (quickly) whose message contains `fragment`."""
    start = time.perf_counter()
    with pytest.raises(BadInput) as e:
        parse_certificate_bytes(data)
    assert time.perf_counter() - start < 5
    assert fragment in str(e.value), str(e.value)
    return str(e.value)


# --- exact numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("17", Fraction(17)), ("-3", Fraction(-3)), ("+5", Fraction(5)), ("0", Fraction(0)),
    ("-7/16", Fraction(-7, 16)), ("6/4", Fraction(3, 2)), ("0x1.8p-3", Fraction(3, 16)),
    ("-0x0p+0", Fraction(0)), ("0X1P4", Fraction(16)), ("0x.8p1", None), ("0xA.Bp0", Fraction(0xAB, 16)),
    ("0x1.p0", Fraction(1)), (12, Fraction(12)),
])
def test_number_forms(text, value):
    """Integers, p/q and C99 hex floats denote exactly one rational."""
    if value is None:  # "0x.8p1": hex floats need a digit before the point in this grammar
        with pytest.raises(BadInput):
            parse_number(text, "x")
        return
    assert parse_number(text, "x") == value


@pytest.mark.parametrize("text", [
    "0.5", "1e-3", "1E3", "nan", "NaN", "inf", "-inf", "Infinity", "0x1.8", "1/0", "-1/-2", "1/-2",
    " 1", "1 ", "", "0x", "0xp3", "1_000", "٣", "1/2/3", "0x1p", "--1", True, False, None, 0.5, [1], {"a": 1},
])
def test_number_refused_forms(text):
    """Decimals, exponents, NaN/inf, JSON floats, booleans and junk are BadInput naming the place."""
    with pytest.raises(BadInput) as e:
        parse_number(text, "claim.margin")
    assert str(e.value).startswith("claim.margin")


@given(st.fractions(max_denominator=10 ** 30) | st.floats(allow_nan=False, allow_infinity=False))
def test_format_parse_round_trip(x):
    """format_number writes exactly what parse_number reads back."""
    assert parse_number(format_number(x), "x") == Fraction(x)


def test_format_refuses_non_finite():
    """format_number never writes NaN or infinity."""
    for v in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError):
            format_number(v)


LIMIT_TEXT = 2 * exact.MAX_DIGITS + 8


@pytest.mark.parametrize("make", [
    lambda n: "7" * n,                                   # integer
    lambda n: "1/" + "3" * (n - 2),                      # ratio
    lambda n: "0x1." + "f" * (n - 7) + "p-1",            # hex float
])
def test_number_text_length_limit(make):
    """A number string may have LIMIT_TEXT (808) characters; one more is refused."""
    assert len(make(LIMIT_TEXT)) == LIMIT_TEXT
    parse_number(make(LIMIT_TEXT), "x")
    with pytest.raises(BadInput, match="longer than"):
        parse_number(make(LIMIT_TEXT + 1), "x")


def test_hex_exponent_limit():
    """Hex exponents within +-4096 are read; +-4097 and huge ones are refused without building them."""
    e = exact.MAX_BINARY_EXPONENT
    assert parse_number(f"0x1p{e}", "x") == Fraction(2) ** e
    assert parse_number(f"0x1p-{e}", "x") == Fraction(1, 2 ** e)
    for text in (f"0x1p{e + 1}", f"-0x1p-{e + 1}", "0x1p999999999999999999", "0x1p-" + "9" * 700):
        start = time.perf_counter()
        with pytest.raises(BadInput, match="exponent"):
            parse_number(text, "x")
        assert time.perf_counter() - start < 1


def test_json_integer_size_limit():
    """A JSON integer where an exact number is expected: up to 1600 bits; larger is refused."""
    bits = exact.MAX_DIGITS * 4
    assert parse_number(2 ** bits - 1, "x") == 2 ** bits - 1
    with pytest.raises(BadInput, match="too large"):
        parse_number(2 ** bits, "x")


def test_parse_int():
    """parse_int takes JSON integers in range only (no bools, strings or floats)."""
    assert parse_int(3, "x", 0, 5) == 3
    for v in (True, "3", 3.0, None, 6, -1):
        with pytest.raises(BadInput):
            parse_int(v, "x", 0, 5)


# --- envelope ----------------------------------------------------------------------------------------

def test_valid_envelope_and_generator_floats():
    """A well-formed envelope parses; JSON floats are allowed inside `generator` only."""
    doc = parse_certificate_bytes(raw(cert()))
    assert doc["kind"] == "prediction" and doc["claim"]["margin"] == "0x1p-3"
    parse_certificate_bytes(raw(cert(generator={"x": [1.5, {"y": -2.5e-300}]})))
    parse_certificate_bytes(raw({k: v for k, v in cert().items() if k != "generator"}))


@pytest.mark.parametrize("case", sorted(ENVELOPE_ERRORS))
def test_envelope_errors(case):
    """Each malformed envelope is BadInput with a message naming the defect, within a second or so."""
    data, fragment = ENVELOPE_ERRORS[case]
    bad(data, fragment)


def test_envelope_errors_are_schema_violations_too():
    """The JSON Schema refuses the envelope violations it can express."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for case in ("float in claim", "float exponent in evidence", "missing claim", "unknown field",
                 "wrong format", "version 2", "version string", "version true", "kind not string",
                 "sha uppercase", "sha short", "claim array", "evidence string", "generator array"):
        doc = json.loads(ENVELOPE_ERRORS[case][0])
        assert not validator.is_valid(doc), case
    for claim in ({"tokens": [1], "predicted": 0, "margin": "0.5"}, {"tokens": [1], "predicted": 0},
                  {"tokens": [], "predicted": 0, "margin": "1"}, {"tokens": [1], "predicted": -1, "margin": "1"},
                  {"tokens": [1], "predicted": 0, "margin": "1", "x": 1}):
        assert not validator.is_valid(cert(claim=claim)), claim
    assert not validator.is_valid(cert(evidence={"hint": "1"}))
    assert not validator.is_valid(cert(kind="telepathy"))
    validator.validate(cert())


def test_generated_certificate_validates_against_schema(tmp_path):
    """A certificate written by `tcert predict`'s code path validates against the schema."""
    from tcert.generator import certificate
    from tcert.generator.model.files import save_model
    from tcert.generator.prediction import prediction_certificate
    from tcert.generator.model.random_models import random_model
    from tcert.checker.modelfile import load_model
    tensors, config = random_model("neox1l", seed=3)
    path = str(tmp_path / "m.safetensors")
    save_model(path, tensors, config)
    doc, _ = prediction_certificate(load_model(path), [1, 2, 3, 4])
    certificate.write(str(tmp_path / "c.json"), doc)
    on_disk = json.loads((tmp_path / "c.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(on_disk)
    parse_certificate_bytes((tmp_path / "c.json").read_bytes())


# --- documented limits: at the limit and one past ---------------------------------------------------

def test_file_size_limit(tmp_path, monkeypatch):
    """A certificate file of exactly MAX_CERT_BYTES is read; one byte more is refused."""
    body = raw(cert())
    limit = len(body) + 100
    monkeypatch.setattr(envelope, "MAX_CERT_BYTES", limit)
    at = tmp_path / "at.json"
    at.write_bytes(body + b" " * (limit - len(body)))
    assert envelope.load_certificate(str(at))["kind"] == "prediction"
    past = tmp_path / "past.json"
    past.write_bytes(body + b" " * (limit - len(body) + 1))
    with pytest.raises(BadInput, match="larger than"):
        envelope.load_certificate(str(past))
    assert envelope.MAX_CERT_BYTES == limit  # the patched value is the one in force


def test_default_file_size_limit():
    """The limit in force is 256 MiB."""
    assert envelope.MAX_CERT_BYTES == 256 << 20


def nested(depth: int):
    """A claim whose deepest value sits at `depth` (the claim object itself is depth 1)."""
    value = "1"
    for _ in range(depth - 2):
        value = [value]
    return {"tokens": value}


def test_nesting_depth_limit():
    """claim/evidence may nest MAX_DEPTH (32) levels deep; 33 is refused."""
    d = envelope.MAX_DEPTH
    parse_certificate_bytes(raw(cert(claim=nested(d))))
    parse_certificate_bytes(raw(cert(evidence=nested(d))))
    bad(raw(cert(claim=nested(d + 1))), f"nesting deeper than {d}")
    bad(raw(cert(evidence=nested(d + 1))), f"nesting deeper than {d}")


def test_array_length_limit(monkeypatch):
    """Arrays in claim/evidence may hold MAX_ARRAY elements; one more is refused."""
    monkeypatch.setattr(envelope, "MAX_ARRAY", 1000)
    parse_certificate_bytes(raw(cert(evidence={"a": ["1"] * 1000})))
    bad(raw(cert(evidence={"a": ["1"] * 1001})), "array longer than 1000")


def test_rows_of_scalars_fast_path(monkeypatch):
    """`_flat_rows` (lists of rows of scalars, a refine certificate's entries, passed without a walk per row)
    refuses what the general walk refuses: a float, a dict or a list inside a row or beside the rows, a row
    longer than MAX_ARRAY, rows whose scalars would pass MAX_DEPTH (test_nesting_depth_limit: the innermost
    lists of nested(d + 1) are such rows)."""
    rows = [[1, "0x1p-3", True, None], ["e", 2]]
    parse_certificate_bytes(raw(cert(evidence={"mixed": rows})))
    for bad_rows in (rows + [["1", 1.5]], rows + [[{"x": "1"}]], rows + [[["1"]] * 2], rows + [{"x": 1.5}],
                     rows + [1.5]):
        assert not envelope._flat_rows(bad_rows, 2)
    bad(raw(cert(evidence={"mixed": rows + [["1", 1.5]]})), "JSON float")
    bad(raw(cert(evidence={"mixed": rows + [{"x": 1.5}]})), "JSON float")
    assert envelope._flat_rows(rows, envelope.MAX_DEPTH - 2) and not envelope._flat_rows(rows, envelope.MAX_DEPTH - 1)
    monkeypatch.setattr(envelope, "MAX_ARRAY", 3)
    bad(raw(cert(evidence={"mixed": [["1", "2"], ["1", "2", "3", "4"]]})), "array longer than 3")


def test_default_array_limit():
    """The array-length limit in force is 50,000,000 elements."""
    assert envelope.MAX_ARRAY == 50_000_000 and envelope.MAX_DEPTH == 32


def test_json_integer_digits_limit():
    """The JSON parser reads integers of up to 4300 digits (Python's limit); longer is refused."""
    parse_certificate_bytes(raw(cert()).replace(b'"evidence": {}', b'"evidence": {"a": ' + b"9" * 4300 + b"}"))
    bad(raw(cert()).replace(b'"predicted": 0', b'"predicted": ' + b"9" * 4301), "not valid JSON")


# --- fuzz: hypothesis-generated JSON ------------------------------------------------------------------

json_leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
               | st.integers(min_value=10 ** 30, max_value=10 ** 60).map(str)
               | st.sampled_from(["0x1p99999", "0x1p-4097", "1/0", "NaN", "0x1.8p-3", "-7/16"]))
json_values = st.recursive(json_leaves, lambda kids: st.lists(kids, max_size=5)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=5), max_leaves=30)


@settings(max_examples=fuzz_examples(200))
@given(doc=st.dictionaries(st.sampled_from(sorted(envelope.ENVELOPE_KEYS | {"generator", "x"})), json_values)
       | json_values, fill=st.booleans())
def test_fuzz_envelope_never_crashes(doc, fill):
    """Arbitrary JSON (NaN/inf floats, huge numbers, odd unicode): a dict or BadInput, never another
    exception; what passes has the envelope's shape and no float in claim/evidence."""
    if fill and isinstance(doc, dict):
        doc = {**cert(), **doc}
    data = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    try:
        out = parse_certificate_bytes(data)
    except BadInput:
        return
    assert set(out) - {"generator"} == envelope.ENVELOPE_KEYS
    assert not has_float(out["claim"]) and not has_float(out["evidence"])


def has_float(value) -> bool:
    """Whether a parsed JSON tree holds a float (or the envelope's float marker) anywhere."""
    if isinstance(value, dict):
        return any(has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(has_float(v) for v in value)
    return not isinstance(value, (str, int, bool, type(None)))


@settings(max_examples=fuzz_examples(300))
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    """Random bytes: BadInput or a valid envelope, never another exception."""
    try:
        parse_certificate_bytes(data)
    except BadInput:
        pass


@settings(max_examples=fuzz_examples(300))
@given(text=st.text(max_size=60) | st.from_regex(r"[+-]?0[xX][0-9a-f]{0,5}(\.[0-9a-f]*)?[pP][+-]?[0-9]{1,6}"))
def test_fuzz_number_parser(text):
    """Arbitrary strings: an exact Fraction or BadInput; accepted ones round-trip."""
    try:
        v = parse_number(text, "x")
    except BadInput:
        return
    assert isinstance(v, Fraction)
    assert parse_number(format_number(v), "x") == v


def test_schema_file_is_a_valid_schema():
    """docs/certificate.schema.json is itself a valid draft 2020-12 schema."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
