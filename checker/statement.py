"""The statement: a certificate's claim in plain words, written by the checker from the claim.

`statement_for(kind, claim, model)` turns a (validated) claim into one English paragraph. The generator
calls it to write a certificate's `statement`; the checker calls it again after the kind's obligations
held, and obligation "statement: the claim in words" requires the certificate's text to be exactly the
regenerated one, so the words a person reads are the words the checker proved. A stale statement (claim
edited, words kept) or a forged one is REJECTED. A certificate without `statement` claims nothing in
words; the checker's own text is still reported (`Obligations.statement`).

Numbers in words are rounded in the direction that keeps the sentence true (`decimal`): a lower bound (a
margin, an accuracy) down, an upper bound (an influence constant) up, to 6 significant digits; the exact
values stay in the claim. Token ids are always quoted. Token texts are added when the model's config
names a tokenizer and a vocabulary file of that name lies beside the model file (one token a line, line i
= token i: the format `tcert train text` writes). The vocabulary file is not part of the model file, so
the statement names its SHA-256: another vocabulary gives other words and a REJECTED statement. When no
such file is there the statement says so and quotes ids only (docs/certificate-envelope.md, "Statement").
"""

import hashlib
import math
import os
from fractions import Fraction

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_number

MAX_VOCAB_BYTES = 64 << 20
DIGITS = 6


def decimal(q, direction: int, digits: int = DIGITS) -> str:
    """`q` (exact) with `digits` significant digits, rounded down (direction -1) or up (+1): the printed
    number is <= q, or >= q, as the sentence needs. Exact arithmetic only."""
    q = Fraction(q)
    if q == 0:
        return "0"
    e = math.floor(math.log10(abs(q.numerator))) - math.floor(math.log10(q.denominator)) + 1
    while abs(q) >= Fraction(10) ** e:      # the estimate can be off by one either way: settle it exactly
        e += 1
    while abs(q) < Fraction(10) ** (e - 1):
        e -= 1
    scaled = q * Fraction(10) ** (digits - e)   # |scaled| in [10^(digits-1), 10^digits)
    n = math.floor(scaled) if direction < 0 else math.ceil(scaled)
    sign, text = ("-" if n < 0 else ""), str(abs(n))
    point = e                                  # digits before the decimal point
    if len(text) > digits:                     # rounding up reached the next power of ten
        text, point = text[:-1], point + 1
    if -4 < point <= 15:
        padded = text + "0" * max(0, point - len(text))
        whole = padded[:point] if point > 0 else "0"
        frac = (("0" * -point + text) if point <= 0 else padded[point:]).rstrip("0")
        return sign + whole + ("." + frac if frac else "")
    mant = (text[0] + "." + text[1:]).rstrip("0").rstrip(".")
    return f"{sign}{mant}e{point - 1:+d}"


# --- token texts ------------------------------------------------------------------------------------

class Vocabulary:
    """The token texts of a vocabulary file (None texts: none was found) and what the statement says of it."""

    def __init__(self, texts, note: str):
        self.texts, self.note = texts, note

    def quote(self, tokens: list) -> str:
        """` ("text")` for a token list, WordPiece-style ('##' pieces glued to the one before); '' without texts."""
        if self.texts is None:
            return ""
        words = ""
        for t in tokens:
            piece = self.texts[t]
            words += piece[2:] if piece.startswith("##") and words else (" " if words else "") + piece
        return f" ({_quoted(words)})"


def _quoted(text: str) -> str:
    """A text in double quotes, with quotes and backslashes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def vocabulary(model) -> Vocabulary:
    """The vocabulary the statement quotes: the file the config's `tokenizer_name` names beside the model file.
    BadInput if that file exists but is unreadable or does not list exactly d_vocab tokens."""
    name = model.config.tokenizer_name
    if name is None:
        return Vocabulary(None, "")
    folder = os.path.dirname(os.path.abspath(model.path)) if model.path else None
    parts = name.replace("\\", "/").split("/")
    path = os.path.join(folder, *parts) if folder and not os.path.isabs(name) and ".." not in parts else None
    if path is None or not os.path.isfile(path):
        return Vocabulary(None, f" Token ids of tokenizer {_quoted(name)}: no vocabulary file of that name "
                                "beside the model file, so no token texts.")
    with open(path, "rb") as f:
        data = f.read(MAX_VOCAB_BYTES + 1)
    try:
        if len(data) > MAX_VOCAB_BYTES:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "too large")
        texts = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise BadInput(f"vocabulary {name[:40]!r}: not UTF-8 text of at most {MAX_VOCAB_BYTES} bytes") from None
    if texts and texts[-1] == "":
        texts.pop()
    if len(texts) != model.config.d_vocab:
        raise BadInput(f"vocabulary {name[:40]!r}: {len(texts)} tokens, the model has d_vocab {model.config.d_vocab}")
    sha = hashlib.sha256(data).hexdigest()
    return Vocabulary(texts, f" Token texts from the vocabulary file {_quoted(name)} (SHA-256 {sha}).")


# --- one sentence per kind ------------------------------------------------------------------------------

def _ids(tokens: list) -> str:
    return "[" + ", ".join(str(t) for t in tokens) + "]"


def _tokens(tokens: list, voc: Vocabulary) -> str:
    return f"{_ids(tokens)}{voc.quote(tokens)}"


def _token(t: int, voc: Vocabulary) -> str:
    return f"{t}{voc.quote([t])}"


def _prediction(claim: dict, voc: Vocabulary) -> str:
    tokens, k = claim["tokens"], claim["predicted"]
    margin = decimal(_number(claim["margin"]), -1)
    return (f"On the input {_tokens(tokens, voc)}, {len(tokens)} token(s), the model's greedy next token is "
            f"{_token(k, voc)}: its logit exceeds every other token's logit by at least {margin}.")


def _free_set(free: dict, d_vocab: int, voc: Vocabulary) -> str:
    """The designed set of free strings t, in words."""
    if free["kind"] == "any":
        return f"every string t of exactly {free['length']} token(s) ({d_vocab}^{free['length']} strings)"
    if free["kind"] == "upto":
        return f"every string t of every length 0 to {free['length']} over the {d_vocab} tokens"
    tokens = free["tokens"]
    count = math.factorial(len(tokens))
    for t in set(tokens):
        count //= math.factorial(tokens.count(t))
    return (f"every ordering t of the {len(tokens)} token(s) {_tokens(tokens, voc)} ({count} distinct "
            "string(s))")


def _overwhelm(claim: dict, d_vocab: int, voc: Vocabulary) -> str:
    prefix = claim["prefix"]
    fixed = f"the {len(prefix)}-token prefix {_tokens(prefix, voc)}" if prefix else "the empty prefix"
    return (f"For {fixed} and the query token {_token(claim['query'], voc)}, the model's greedy next token "
            f"after prefix + t + query is {_token(claim['predicted'], voc)} for "
            f"{_free_set(claim['free'], d_vocab, voc)}.")


def _accuracy(claim: dict) -> str:
    n, total, count = claim["n_ctx"], claim["inputs"], claim["correct_at_least"]
    last = n - 1
    correct = (f"an input t_0..t_{last} is answered correctly when, at the last position, the logit of "
               f"max(t_0..t_{last}) is strictly larger than every other logit.")
    if "distribution" not in claim:
        return (f"The Max-of-{n} model (vocabulary {claim['d_vocab']}) answers at least {count} of its {total} "
                f"inputs correctly (at least {decimal(Fraction(100 * count, total), -1)}%): {correct}")
    dist, weight, mass = claim["distribution"], _number(claim["total_weight"]), _number(count)
    m0 = dist.get("max_at_least", 0)
    terms = (" * ".join(f"w_{i}(t_{i})" for i in range(n)) if "position_weights" in dist else "1") + \
        (f" if max(t) >= {m0}, else 0" if m0 else "")
    share = f" (at least {decimal(100 * mass / weight, -1)}%)" if weight else ""
    listed = ", with the position weights w_i the claim lists" if "position_weights" in dist else ""
    return (f"Under the claim's input distribution (the weight of input t is {terms}{listed}), the inputs the "
            f"Max-of-{n} model (vocabulary {claim['d_vocab']}) answers correctly weigh at least "
            f"{decimal(mass, -1)} of the total weight {weight} (exactly){share}: {correct}")


def _influence_local(local: dict, voc: Vocabulary) -> str:
    """The local claim form (checker/kinds/influence/local.py): one input, its own attention pattern."""
    p, R = local["prediction"], local["substitutions"]
    text = (f"On the input {_tokens(p['tokens'], voc)}, {len(p['tokens'])} token(s), the model's greedy next token "
            f"is {_token(p['predicted'], voc)}, ahead of every other token by at least "
            f"{decimal(_number(p['margin']), -1)}. Changing the token at any one position other than the last "
            f"moves the model's final residual stream at the last position by at most "
            f"{decimal(_number(local['change']), +1)} in L2 norm, and its next-token distribution by at most "
            f"{decimal(_number(local['change_prob']), +1)} in L1 norm.")
    if R:
        text += (f" Changing the tokens at any {R} or fewer positions other than the last leaves "
                 f"{_token(p['predicted'], voc)} the greedy next token.")
    return text


def _influence(claim: dict, n_layers: int, voc: Vocabulary) -> str:
    if "local" in claim:
        return _influence_local(claim["local"], voc)
    up = {k: decimal(_number(claim[k]), +1) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    power = "" if n_layers == 2 else f"^{n_layers - 1}"
    rate = "1/n" if claim["rate"] == "inverse" else f"H_n{power}/n with H_n = 1 + 1/2 + ... + 1/n"
    text = (f"For every input length n from {claim['n_min']} to {claim['n_max']} and any two inputs of length n "
            "that differ in exactly one position other than the last: the model's final residual stream at "
            f"the last position moves by at most min({up['C']} r(n), {up['C_abs']}) in L2 norm, and its "
            f"next-token distribution by at most min({up['C_prob']} r(n), {up['C_prob_abs']}) in L1 norm, "
            f"where r(n) = {rate}.")
    if "corollary" in claim:
        cor = claim["corollary"]
        p = cor["prediction"]
        n = len(p["tokens"])
        text += (f" Moreover, on the input {_tokens(p['tokens'], voc)} ({n} tokens) the greedy next token is "
                 f"{_token(p['predicted'], voc)}, ahead of every other token by at least "
                 f"{decimal(_number(p['margin']), -1)}, and it stays the greedy next token under any change of "
                 f"at most {cor['substitutions']} of the positions 0..{n - 2}.")
    return text


def _number(text) -> Fraction:
    return parse_number(text, "claim")


def statement_for(kind: str, claim: dict, model) -> str:
    """The claim of a certificate of `kind` about `model`, in words (claim already validated by the kind)."""
    voc = vocabulary(model)
    cfg = model.config
    try:
        if kind == "prediction":
            text = _prediction(claim, voc)
        elif kind == "overwhelm":
            text = _overwhelm(claim, cfg.d_vocab, voc)
        elif kind == "accuracy":
            text = _accuracy(claim)
        elif kind == "influence":
            text = _influence(claim, cfg.n_layers, voc)
        else:
            raise BadInput(f"statement: unknown kind {str(kind)[:40]!r}")
    except (KeyError, TypeError, IndexError, AttributeError):
        raise BadInput(f"statement: the {str(kind)[:40]} claim does not have the kind's shape") from None
    return text + voc.note


def check_statement(cert: dict, model, ob) -> None:
    """Obligation "statement: the claim in words": the certificate's `statement`, when it has one, is exactly
    the checker's text for its claim. Sets `ob.statement` to the checker's text either way."""
    with ob.step("statement: the claim in words") as fig:
        ob.statement = ours = statement_for(cert["kind"], cert["claim"], model)
        fig["statement"] = ours
        if "statement" not in cert:
            fig["certificate statement"] = "none"
            return
        theirs = cert["statement"]
        if theirs != ours:
            i = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
            lo = max(0, i - 30)
            raise Rejected("", f"the certificate's statement differs from the claim in words at character {i}: "
                               f"it says ...{theirs[lo:i + 40]!r}..., the claim reads ...{ours[lo:i + 40]!r}..."
                               + _missing_vocabulary_hint(model, theirs))


def _missing_vocabulary_hint(model, theirs: str) -> str:
    """Why a statement may differ although nobody edited it: the vocabulary file did not travel with it."""
    if "Token texts from the vocabulary file" in theirs and vocabulary(model).texts is None:
        return (f" (the certificate quotes token texts; put the vocabulary file {model.config.tokenizer_name!r} beside "
                "the model file to check them)")
    return ""
