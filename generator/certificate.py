"""Write certificates: the envelope, exact numbers, deterministic bytes."""

import json
from fractions import Fraction

from tcert.checker.envelope import FORMAT, VERSION
from tcert.checker.numbers import format_number

GENERATOR_NAME = "tcert"
GENERATOR_VERSION = "0.1.0"


def num(x) -> str:
    """A float or rational written exactly (hex float for floats, p/q for Fractions)."""
    if isinstance(x, (Fraction, int)):
        return format_number(x)
    return format_number(float(x))


def envelope(kind: str, model, claim: dict, evidence: dict, info: dict | None = None) -> dict:
    """The certificate object for `claim` about `model` with `evidence`."""
    gen = {"name": GENERATOR_NAME, "version": GENERATOR_VERSION}
    if info:
        gen.update(info)
    return {"format": FORMAT, "version": VERSION, "kind": kind, "model_sha256": model.sha256,
            "claim": claim, "evidence": evidence, "generator": gen}


def dumps(cert: dict) -> str:
    """Deterministic JSON text: same certificate, same bytes."""
    return json.dumps(cert, sort_keys=True, indent=1, ensure_ascii=True) + "\n"


def write(path: str, cert: dict) -> None:
    """Write `cert` to `path` deterministically."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(cert))
