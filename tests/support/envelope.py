"""Well-formed and malformed certificate envelopes shared by the envelope and hostile-input tests."""

import json


SHA = "ab" * 32


def cert(**over) -> dict:
    """A minimal well-formed prediction envelope (its claim need not be true)."""
    doc = {"format": "tcert-certificate", "version": 1, "kind": "prediction", "model_sha256": SHA,
           "claim": {"tokens": [1, 2], "predicted": 0, "margin": "0x1p-3"}, "evidence": {},
           "generator": {"name": "tcert", "seconds": 0.25}}
    doc.update(over)
    return doc


def raw(doc) -> bytes:
    """JSON bytes of a document."""
    return json.dumps(doc).encode()


ENVELOPE_ERRORS = {
    "not JSON": (b"{", "not valid JSON"),
    "empty": (b"", "not valid JSON"),
    "top-level array": (b"[1, 2]", "not a JSON object"),
    "top-level string": (b'"x"', "not a JSON object"),
    "UTF-8 BOM": (b"\xef\xbb\xbf" + raw(cert()), "not valid JSON"),
    "non-UTF-8 (latin-1)": (raw(cert(kind="pr\u00e9diction")).replace(b"\\u00e9", b"\xe9"), "not UTF-8"),
    "non-UTF-8 (lone continuation)": (b'{"a": "\x80"}', "not UTF-8"),
    "UTF-16": (json.dumps(cert()).encode("utf-16"), "not UTF-8"),
    "NaN literal": (raw(cert()).replace(b'"0x1p-3"', b"NaN"), "constant NaN"),
    "Infinity literal": (raw(cert()).replace(b'"0x1p-3"', b"Infinity"), "constant Infinity"),
    "-Infinity literal": (raw(cert()).replace(b'"0x1p-3"', b"-Infinity"), "constant -Infinity"),
    "NaN in generator": (raw(cert()).replace(b"0.25", b"NaN"), "constant NaN"),
    "float in claim": (raw(cert(claim={"margin": 0.125})), "JSON float"),
    "float 1.0 in claim": (raw(cert(claim={"tokens": [1.0]})), "JSON float"),
    "float exponent in evidence": (raw(cert(evidence={"a": [{"b": 1e5}]})), "JSON float"),
    "float version": (raw(cert(version=1.0)), "unsupported version"),
    "duplicate top-level key": (b'{"kind": "prediction", "kind": "prediction"}', "duplicate key"),
    "duplicate key in claim": (raw(cert()).replace(b'"predicted": 0', b'"predicted": 0, "predicted": 1'),
                               "duplicate key"),
    "missing claim": (raw({k: v for k, v in cert().items() if k != "claim"}), "missing field"),
    "missing everything": (b"{}", "missing field"),
    "unknown field": (raw(cert(comment="hi")), "unknown field"),
    "wrong format": (raw(cert(format="tcert")), "format"),
    "version 2": (raw(cert(version=2)), "unsupported version"),
    "version 0": (raw(cert(version=0)), "unsupported version"),
    "version true": (raw(cert(version=True)), "unsupported version"),
    "version string": (raw(cert(version="1")), "unsupported version"),
    "kind not string": (raw(cert(kind=["prediction"])), "kind must be a string"),
    "sha uppercase": (raw(cert(model_sha256="AB" * 32)), "model_sha256"),
    "sha short": (raw(cert(model_sha256="ab" * 31)), "model_sha256"),
    "sha not string": (raw(cert(model_sha256=1)), "model_sha256"),
    "claim array": (raw(cert(claim=[])), "claim must be an object"),
    "evidence string": (raw(cert(evidence="{}")), "evidence must be an object"),
    "generator array": (raw(cert(generator=[])), "generator must be an object"),
    "truncated": (raw(cert())[:-1], "not valid JSON"),
    "trailing garbage": (raw(cert()) + b"x", "not valid JSON"),
    "two documents": (raw(cert()) + raw(cert()), "not valid JSON"),
    "10^5 nested arrays": (b'{"claim": ' + b"[" * 10 ** 5 + b"]" * 10 ** 5 + b"}", "not valid JSON"),
    "10^5 nested objects": (b'{"claim": ' + b'{"a": ' * 10 ** 5 + b"1" + b"}" * 10 ** 5 + b"}",
                            "not valid JSON"),
    "10^6-digit integer": (b'{"claim": {"tokens": [' + b"9" * 10 ** 6 + b"]}}", "not valid JSON"),
}
