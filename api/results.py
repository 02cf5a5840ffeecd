"""The two objects the API hands back: a Certificate (what the generator wrote) and a Verdict (what the
checker decided)."""

import json
from dataclasses import dataclass, field

from tcert.checker.numbers import parse_number
from tcert.checker.obligations import Obligation

from tcert.api.errors import RejectedError
from tcert.api.files import write_text


@dataclass
class Certificate:
    """A certificate the generator made: `data` is the JSON object tcert-check reads, `figures` the numbers
    the CLI prints (floats, for display: the certified ones come from `check`), `model` the Model it binds to."""

    data: dict
    figures: dict
    model: object = field(repr=False, default=None)

    @property
    def kind(self) -> str:
        return self.data["kind"]

    @property
    def claim(self) -> dict:
        return self.data["claim"]

    @property
    def statement(self) -> str:
        """The claim in plain words (the certificate's own `statement` field when it carries one)."""
        return self.data.get("statement") or statement(self.data)

    def to_json(self) -> str:
        """The certificate's bytes as `tcert` writes them (deterministic: same certificate, same text)."""
        from tcert.generator.certificate import dumps
        return dumps(self.data)

    def save(self, path) -> str:
        """Write the certificate to `path` (its folder must exist); return the path."""
        return write_text(path, self.to_json())


def _n(text) -> str:
    """An exact certificate number as `show` writes it (display only)."""
    from tcert.checker.numbers import show
    return show(parse_number(text, "claim"))


def statement(cert: dict) -> str:
    """A one-sentence reading of a certificate's claim."""
    c, kind = cert["claim"], cert["kind"]
    if kind == "prediction":
        return (f"On input {c['tokens']} the model's next token is {c['predicted']}, its logit ahead of every other "
                f"token's by at least {_n(c['margin'])}.")
    if kind == "overwhelm":
        free = c["free"]
        what = {"any": f"every string of {free.get('length')} free tokens",
                "perm": f"every ordering of the free tokens {free.get('tokens')}",
                "upto": f"every string of 0..{free.get('length')} free tokens"}.get(free["kind"], str(free))
        return (f"After the prefix of {len(c['prefix'])} tokens, for {what} followed by query token {c['query']}, "
                f"the model's next token is {c['predicted']}.")
    if kind == "accuracy":
        return (f"The Max-of-{c['n_ctx']} model (d_vocab {c['d_vocab']}) puts the largest token's logit strictly "
                f"first on at least {c['correct_at_least']} of its {c['inputs']} inputs.")
    if kind == "influence" and "local" in c:
        loc, p = c["local"], c["local"]["prediction"]
        return (f"On input {p['tokens']}, changing one non-final token moves the final residual by at most "
                f"{_n(loc['change'])} and the next-token distribution by at most {_n(loc['change_prob'])} in L1; the "
                f"next token {p['predicted']} survives any {loc['substitutions']} changed non-final token(s).")
    if kind == "influence":
        r = "1/n" if c["rate"] == "inverse" else "H_n/n-type"
        text = (f"For inputs of length n in [{c['n_min']}, {c['n_max']}], changing one non-final token moves the "
                f"final residual-stream output by at most min({_n(c['C'])} r(n), {_n(c['C_abs'])}) (rate {r}) and "
                f"the next-token distribution by at most min({_n(c['C_prob'])} r(n), {_n(c['C_prob_abs'])}) in L1.")
        if "corollary" in c:
            p = c["corollary"]["prediction"]
            text += (f" On input {p['tokens']} the next token {p['predicted']} survives any "
                     f"{c['corollary']['substitutions']} changed non-final token(s).")
        return text
    return f"a {kind} claim"


@dataclass
class Verdict:
    """What the checker decided. `verified` is True only when every obligation held; `obligations` lists
    those that held, in order (name, seconds, certified figures); a rejection names `obligation` and
    `detail`. `bool(verdict)` is `verdict.verified`."""

    verified: bool
    kind: str
    summary: str
    obligations: list[Obligation]
    backend: str
    prec: int
    seconds: float
    obligation: str | None = None
    detail: str | None = None

    def __bool__(self) -> bool:
        return self.verified

    def figure(self, key: str):
        """The first certified figure `key` an obligation recorded (e.g. "claim.margin"); KeyError if none."""
        for ob in self.obligations:
            if key in ob.figures:
                return ob.figures[key]
        raise KeyError(key)

    def raise_for_rejection(self) -> "Verdict":
        """Raise RejectedError if the certificate was rejected; return self otherwise."""
        if not self.verified:
            raise RejectedError(self.obligation or "", self.detail or "")
        return self

    def to_json(self) -> str:
        """The verdict as one JSON object (names, times and the verdict; figures shown with `show`)."""
        from tcert.checker.numbers import show
        return json.dumps({"verdict": "VERIFIED" if self.verified else "REJECTED", "kind": self.kind,
                           "summary": self.summary, "backend": self.backend, "prec": self.prec,
                           "obligation": self.obligation, "detail": self.detail,
                           "obligations": [{"name": o.name, "seconds": round(o.seconds, 6),
                                            "figures": {k: show(v) if not isinstance(v, str) else v
                                                        for k, v in o.figures.items()}} for o in self.obligations]})

    def __str__(self) -> str:
        if self.verified:
            return f"VERIFIED: {self.kind}: {self.summary}"
        return f"REJECTED: {self.obligation}: {self.detail}"
