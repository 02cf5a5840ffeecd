"""One function per certificate kind. Each validates its arguments (BadInputError), runs the family's
generator (tcert.generator.<kind>), and returns a Certificate, or raises InconclusiveError when there is
nothing true enough to certify. Nothing is written to disk: call `.save(path)`."""

import json

from tcert.api.errors import BadInputError, InconclusiveError, translating
from tcert.api.models import load_model
from tcert.api.results import Certificate


def _ids(tokens, what: str) -> list:
    """Token ids from a list of ints or a "3,17,5" string."""
    if isinstance(tokens, str):
        try:
            return [int(t) for t in tokens.replace(" ", "").split(",") if t != ""]
        except ValueError:
            raise BadInputError(f"{what}: {tokens[:40]!r} is not a comma-separated list of integers") from None
    try:
        return [int(t) for t in tokens]
    except (TypeError, ValueError):
        raise BadInputError(f"{what}: expected a list of token ids") from None


def _in_vocab(model, tokens, what: str, lo: int = 1):
    c = model.config
    if not lo <= len(tokens) <= c.n_ctx or min(tokens) < 0 or max(tokens) >= c.d_vocab:
        raise BadInputError(f"{what}: need {lo}..{c.n_ctx} ids in [0, {c.d_vocab})")


def _plain(report: dict) -> dict:
    """A generator report as plain JSON values (numpy numbers and Fractions as floats)."""
    return json.loads(json.dumps(report, default=float))


@translating
def predict(model, tokens) -> Certificate:
    """A prediction certificate: the greedy next token on `tokens`, with a margin the checker can confirm.
    Figures: predicted, runner_up, gap (float), margin (claimed). InconclusiveError on a near-tie."""
    from tcert.generator.prediction import prediction_certificate
    model = load_model(model)
    tokens = _ids(tokens, "tokens")
    _in_vocab(model, tokens, "tokens")
    cert, p = prediction_certificate(model, tokens)
    figures = {"predicted": p["predicted"], "runner_up": p["runner_up"], "gap": float(p["gap"]),
               "margin": float(p["margin"])}
    if cert is None:
        raise InconclusiveError(f"near-tie: top logits {p['predicted']} and {p['runner_up']} differ by "
                                f"{p['gap']:.3g}; no certificate", figures)
    return Certificate(cert, figures, model)


def _text_ids(model, text: str, what: str) -> list:
    """Token ids of `text` with the tokenizer the model file names."""
    from tcert.generator.train.text_data import encode, model_tokenizer
    ids = encode(model_tokenizer(model.path, model.config.tokenizer_name), text)
    if not ids:
        raise BadInputError(f"{what}: {text[:40]!r} encodes to no tokens")
    return ids


def text_tokens(model, text: str) -> list:
    """The token ids of `text` under the tokenizer the model file names (`tokenizer_name`)."""
    return _text_ids(load_model(model), text, "text")


@translating
def overwhelm(model, prefix, query: int, free: str, method: str = "lp", value_bound: str = "auto",
              hints: str = "auto") -> Certificate:
    """An overwhelm certificate: after `prefix`, for every free string in `free` (any:N | perm:ID,ID,... |
    upto:N) followed by `query`, the next token is the same. `method`: naive | lp (perm sets only) | tight.
    Figures: the generator's report (W, PTP/2, margin, per head). InconclusiveError when not Overwhelmed."""
    from tcert.generator.overwhelm.claim import parse_free
    model = load_model(model)
    prefix = _ids(prefix, "prefix")
    if method not in ("naive", "lp", "tight"):
        raise BadInputError(f"method: {method!r} is not one of naive, lp, tight")
    if not isinstance(query, int) or isinstance(query, bool):
        raise BadInputError("query: expected one token id")
    if method == "lp" and (free.startswith("upto:") or free.startswith("any:")):
        raise BadInputError(f"method lp needs a permutation set (perm:...); {free} has independent positions, "
                            "where the LP adds nothing: use method naive (or tight)")
    if free.startswith("upto:"):
        from tcert.generator.overwhelm.upto import generate_upto, parse_upto
        cert, report = generate_upto(model, prefix, query, parse_upto(free), method, value_bound, hints)
        return _overwhelm_result(cert, report, model)
    spec = parse_free(free)
    c = model.config
    if any(not 0 <= t < c.d_vocab for t in prefix + [query] + (spec[2] or [])):
        raise BadInputError(f"token ids must lie in [0, {c.d_vocab})")
    if len(prefix) + spec[1] + 1 > c.n_ctx or spec[1] < 1:
        raise BadInputError(f"need 1 <= n_free and n_fix + n_free + 1 <= n_ctx = {c.n_ctx}")
    if method == "tight":
        from tcert.generator.overwhelm.tight import generate_tight
        cert, report = generate_tight(model, prefix, query, spec)
    else:
        from tcert.generator.overwhelm.naive_lp import generate
        cert, report = generate(model, prefix, query, spec, method, value_bound, hints)
    return _overwhelm_result(cert, report, model)


def _overwhelm_result(cert, report, model) -> Certificate:
    figures = _plain(report)
    if cert is None:
        raise InconclusiveError("Inconclusive: the certified deviation does not fit under the margin; "
                                "no certificate", figures)
    return Certificate(cert, figures, model)


STRATEGIES = ("brute", "cubic", "subcubic", "refine")
# Exact counts established by verified brute-force certificates (model file SHA-256 -> correct inputs).
KNOWN_EXACT = {"9dbb098693d185abc736125322aef131a5c7acfd9d743c784181279764d59f25": 16_763_235}  # maxof4_seed123


def is_maxofk(model) -> bool:
    """Whether the model has the architecture the accuracy kind speaks about."""
    c = model.config
    return (c.n_layers == 1 and c.n_heads == 1 and c.attn_only and not c.has_ln and not c.rotary
            and c.n_ctx >= 2 and c.d_vocab >= 2)


def _accuracy_arguments(model, strategy: str):
    if not is_maxofk(model):
        raise BadInputError("accuracy: needs a 1-layer, 1-head, attention-only model with learned positions")
    if not isinstance(strategy, str) or strategy.partition(":")[0] not in STRATEGIES:
        raise BadInputError(f"strategy must be one of brute, cubic, subcubic[:NAME], refine[:BUDGET] (got {strategy!r})")
    if strategy.startswith(("subcubic", "refine")):
        from tcert.generator.accuracy.refine import parse_budget
        from tcert.generator.accuracy.subcubic import parse_name
        try:
            (parse_name if strategy.startswith("subcubic") else parse_budget)(strategy.partition(":")[2] or None)
        except ValueError as e:
            raise BadInputError(f"strategy: {e}") from None
    c = model.config
    if strategy == "brute" and c.d_vocab ** c.n_ctx > 1 << 26:
        raise BadInputError(f"brute force over {c.d_vocab}^{c.n_ctx} inputs is out of range")


@translating
def accuracy(model, strategy: str = "cubic", true_count: int | None = None, allow_vacuous: bool = False,
             distribution: dict | None = None) -> Certificate:
    """A Max-of-K accuracy certificate: the model is right on at least `figures["bound"]` of its inputs.
    `strategy`: brute | cubic | subcubic[:NAME][+eu] | refine[:BUDGET]. `distribution` (claim.distribution's
    JSON form, docs/accuracy.md): the bound is then the weight of the inputs answered correctly. A bound of 0
    is true of every model and says nothing: InconclusiveError unless `allow_vacuous`."""
    from tcert.generator.accuracy.strategies import make_certificate
    model = load_model(model)
    _accuracy_arguments(model, strategy)
    true_count = true_count if true_count is not None else KNOWN_EXACT.get(model.sha256)
    cert, report = make_certificate(model, strategy, true_count, distribution)   # BadInput: translated
    figures = _plain(report)
    if report["bound"] == 0 and not allow_vacuous:
        raise InconclusiveError(f"vacuous: {strategy} proves correctness on 0 of {report['inputs']} inputs, which "
                                "is true of every model; no certificate (allow_vacuous=True / --force writes it)",
                                figures)
    return Certificate(cert, figures, model)


@translating
def influence(model, n_min: int = 2, n_max: int | None = None, power: int | None = None, tokens=None,
              substitutions: int | None = None) -> Certificate:
    """An influence certificate: one non-final token moves the output by <= C r(n) for n in [n_min, n_max];
    with `tokens`, the robustness corollary (the next token survives `substitutions` changes; default the
    largest certifiable). Figures: C, C_prob, C_abs, C_prob_abs (floats), rate, and the corollary's numbers."""
    from tcert.generator.influence.constants import DEFAULT_POWER, influence_certificate
    from tcert.generator.influence.corollary import corollary_certificate
    from tcert.checker.numbers import parse_number
    model = load_model(model)
    power = DEFAULT_POWER if power is None else power
    info = {}
    if tokens is None:
        if substitutions is not None:
            raise BadInputError("substitutions needs tokens")
        cert = influence_certificate(model, n_min, n_max, power)
    else:
        tokens = _ids(tokens, "tokens")
        _in_vocab(model, tokens, "tokens", lo=2)
        cert, info = corollary_certificate(model, tokens, substitutions, n_min, n_max, power)
        if cert is None:
            raise InconclusiveError(f"no corollary certificate: {info['reason']}", _plain(info))
    claim = cert["claim"]
    figures = {"rate": claim["rate"], "n_min": claim["n_min"], "n_max": claim["n_max"],
               **{k: float(parse_number(claim[k], "claim")) for k in ("C", "C_prob", "C_abs", "C_prob_abs")},
               **_plain(info)}
    return Certificate(cert, figures, model)

