"""Read a certificate file: bounded JSON, then the envelope every kind shares.

Envelope (all fields required unless noted):
    format        "tcert-certificate"
    version       1
    kind          "prediction" | "overwhelm" | "accuracy" | "influence"
    model_sha256  64 lowercase hex digits: the SHA-256 of the model file's bytes
    claim         object: the full statement being certified (kind-specific)
    evidence      object: hints the checker confirms (kind-specific)
    statement     string, optional: the claim in words; must equal the checker's own text for the claim
                  (tcert.checker.statement, obligation "statement: the claim in words")
    model         object, optional: informational only (file name, architecture, parameter count,
                  provenance), never read by any rule
    generator     object, optional: informational only (tool, version, command line, float facts), never
                  read by any rule

JSON floats are refused everywhere except inside the informational `model` and `generator`: exact numbers
are strings.
"""

import json
import os
import re
from itertools import chain

from tcert.checker.errors import BadInput
from tcert.checker.numbers import show

FORMAT = "tcert-certificate"
VERSION = 1
MAX_CERT_BYTES = 256 << 20
MAX_JSON_MEMORY = 2 << 30   # what parsing may cost by `parse_memory` (an eighth of the default memory limit)
MAX_DEPTH = 32
MAX_ARRAY = 50_000_000
_SHA = re.compile(r"[0-9a-f]{64}\Z")
ENVELOPE_KEYS = {"format", "version", "kind", "model_sha256", "claim", "evidence"}
OPTIONAL_KEYS = {"statement", "model", "generator"}
MAX_STATEMENT = 1 << 20
_SCALARS = {str, int, bool, type(None)}    # JSON scalars as json.loads gives them (floats: _Float)


class _Float:
    """Marks a JSON float literal so that the validator can refuse it outside `generator`."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise BadInput(f"certificate: duplicate key {k[:40]!r}")
        out[k] = v
    return out


def _constant(name):
    raise BadInput(f"certificate: JSON constant {name} is not allowed")


def _check_tree(value, where, depth, allow_float):
    if depth > MAX_DEPTH:
        raise BadInput(f"certificate: nesting deeper than {MAX_DEPTH} at {where}")
    if isinstance(value, _Float):
        if not allow_float:
            raise BadInput(f"certificate: {where}: JSON float {value.text[:30]} is not exact; write numbers as strings")
        return
    # A child that is no container and no float, within the depth limit, passes: it is skipped without
    # building its path (the shipped refine certificate's envelope: 0.047 -> 0.020 CPU s).
    if isinstance(value, dict):
        for k, v in value.items():
            if depth >= MAX_DEPTH or isinstance(v, (dict, list, _Float)):
                _check_tree(v, f"{where}.{k[:40]}", depth + 1, allow_float)
    elif isinstance(value, list):
        if len(value) > MAX_ARRAY:
            raise BadInput(f"certificate: {where}: array longer than {MAX_ARRAY}")
        if _flat_rows(value, depth):
            return
        for i, v in enumerate(value):
            if depth >= MAX_DEPTH or isinstance(v, (dict, list, _Float)):
                _check_tree(v, f"{where}[{i}]", depth + 1, allow_float)


def _flat_rows(value: list, depth: int) -> bool:
    """Whether the list `value` at `depth` is a non-empty list of lists of JSON scalars (str, int, bool, None)
    that `_check_tree` passes: each row within the depth (depth + 1 < MAX_DEPTH, so its scalars are not
    visited) and length limits. Read by C-level passes (map, set), not a call per row: a refine certificate's
    thousands of entries (seed123's envelope: 4.4 -> 0.8 ms). False sends the list to the general walk."""
    return (depth + 2 <= MAX_DEPTH and bool(value) and set(map(type, value)) == {list}
            and max(map(len, value)) <= MAX_ARRAY and set(map(type, chain.from_iterable(value))) <= _SCALARS)


def parse_certificate_bytes(data: bytes, max_memory: int = MAX_JSON_MEMORY) -> dict:
    """Decode and validate the envelope of a certificate; raise BadInput on any defect (or when parsing
    would need more than `max_memory` bytes by `parse_memory`)."""
    doc = _json_object(data, max_memory)
    _check_envelope(doc)
    return doc


def parse_memory(data: bytes) -> int:
    """An upper bound of the memory (bytes) that json.loads and the validation walk hold for `data`, from
    one pass of bytes.count per structural character: the bytes and their decoded text (4 bytes per
    character unless all ASCII), 96 per brace, bracket and quote (an object, an array, half a string) and
    48 per comma, 32 per colon (a list slot and a small number, a key's pair). Measured peaks are 0.3 to
    0.9 of it on every shape tried (26 bytes per input byte for [{},{},...], 36 for [[[]],[[]],...];
    docs/soundness.md), so a file this admits costs at most its estimate."""
    text = len(data) if data.isascii() else 4 * len(data)
    return (len(data) + text + 96 * (data.count(b"{") + data.count(b"[") + data.count(b'"'))
            + 48 * data.count(b",") + 32 * data.count(b":"))


def _json_object(data: bytes, max_memory: int) -> dict:
    """The certificate's bytes as one JSON object: at most MAX_CERT_BYTES of UTF-8 whose parse needs at most
    `max_memory` bytes, no duplicate keys, no NaN/Infinity constants, JSON floats marked (refused later
    outside `generator`)."""
    if len(data) > MAX_CERT_BYTES:
        raise BadInput(f"certificate: larger than {MAX_CERT_BYTES} bytes")
    need = parse_memory(data)
    if need > max_memory:
        raise BadInput(f"certificate: parsing its {show(len(data))} bytes ({show(data.count(b'{') + data.count(b'['))} "
                       f"objects and arrays) would need about {show(need >> 20)} MiB, above the reader's limit of "
                       f"{show(max_memory >> 20)} MiB (an eighth of --max-memory)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("certificate: not UTF-8") from None
    # Deep nesting is caught twice: the C parser raises RecursionError, _check_tree bounds the rest.
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_float=_Float, parse_constant=_constant)
    except BadInput:
        raise
    except (ValueError, RecursionError) as e:
        raise BadInput(f"certificate: not valid JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict):
        raise BadInput("certificate: top level is not a JSON object")
    return doc


def _check_envelope(doc: dict) -> None:
    """The envelope fields: exactly the required ones (plus the optional ones), each of its type and value."""
    fields(doc, "certificate", ENVELOPE_KEYS, OPTIONAL_KEYS)
    if doc["format"] != FORMAT:
        raise BadInput(f"certificate: format is not {FORMAT!r}")
    version = doc["version"]
    if version != VERSION or isinstance(version, bool):
        shown = show(version) if isinstance(version, int) and not isinstance(version, bool) else str(version)[:20]
        raise BadInput(f"certificate: unsupported version {shown} (this checker reads {VERSION})")
    if not isinstance(doc["kind"], str):
        raise BadInput("certificate: kind must be a string")
    if not isinstance(doc["model_sha256"], str) or not _SHA.match(doc["model_sha256"]):
        raise BadInput("certificate: model_sha256 must be 64 lowercase hex digits")
    for key in ("claim", "evidence"):
        if not isinstance(doc[key], dict):
            raise BadInput(f"certificate: {key} must be an object")
        _check_tree(doc[key], key, 1, allow_float=False)
    for key in ("model", "generator"):
        if key in doc and not isinstance(doc[key], dict):
            raise BadInput(f"certificate: {key} must be an object")
    if "statement" in doc and not (isinstance(doc["statement"], str) and len(doc["statement"]) <= MAX_STATEMENT):
        raise BadInput(f"certificate: statement must be a string of at most {MAX_STATEMENT} characters")


def read_certificate_bytes(path: str) -> bytes:
    """The bytes of the certificate file at `path` (BadInput beyond MAX_CERT_BYTES)."""
    try:
        with open(path, "rb") as f:   # read the file's size at once (one buffer; no over-size buffer copied)
            size = os.fstat(f.fileno()).st_size
            if size > MAX_CERT_BYTES:
                raise BadInput(f"certificate: larger than {MAX_CERT_BYTES} bytes")
            data = f.read(size + 1) if size else b""
            data += f.read(MAX_CERT_BYTES + 1 - len(data))   # a pipe, or a file that grew
    except OSError as e:
        raise BadInput(f"certificate: cannot read {path}: {e.strerror}") from None
    return data


def load_certificate(path: str, max_memory: int = MAX_JSON_MEMORY) -> dict:
    """Read the certificate file at `path` and validate its envelope (parse memory at most `max_memory`)."""
    return parse_certificate_bytes(read_certificate_bytes(path), max_memory)


def fields(obj: dict, where: str, required: set, optional: set = frozenset()) -> dict:
    """Check that `obj` is an object with exactly the required keys plus optional ones."""
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: must be an object")
    missing = required - set(obj)
    if missing:
        raise BadInput(f"{where}: missing field(s) {sorted(missing)}")
    unknown = set(obj) - required - set(optional)
    if unknown:
        raise BadInput(f"{where}: unknown field(s) {sorted(k[:40] for k in unknown)[:5]}")
    return obj
