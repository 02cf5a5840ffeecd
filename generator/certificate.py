"""Write certificates: the envelope, exact numbers, deterministic bytes."""

import json
from fractions import Fraction

from tcert.checker.envelope import FORMAT, VERSION

GENERATOR_NAME = "tcert"
GENERATOR_VERSION = "0.1.0"


def format_number(value) -> str:
    """Write a rational (Fraction, int, or an exact Python float) in certificate form."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("cannot write a non-finite number into a certificate")
        return value.hex()
    value = Fraction(value)
    text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    den = value.denominator
    if len(text) > 100 and den & (den - 1) == 0:
        # A dyadic number such as 2^3000 is far shorter as a hex float, and stays within the parser's
        # length limit, so everything this function writes parses back to the same value.
        num, exp = value.numerator, -(den.bit_length() - 1)
        while num % 2 == 0:
            num, exp = num // 2, exp + 1
        text = f"{'-' if num < 0 else ''}0x{abs(num):x}p{exp:+d}"
    return text


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
