"""The checker's one entry point: `verify(certificate, model, backend)`.

The CLI, the tests, the benchmarks and the generator's self-checks all call it. A certificate given as
a dict goes through exactly the reader a file does (it is serialised and parsed again), so an
in-memory check can never be more lenient than `tcert-check`.
"""

import json

from tcert.checker import envelope, resources
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import DEFAULT_PREC, Backend, make_backend
from tcert.checker.kinds import checker_for, cost_for
from tcert.checker.modelfile import Model, load_model
from tcert.checker.obligations import Obligations
from tcert.checker.resources import Limits
from tcert.checker.statement import check_statement


def read_certificate(certificate, max_memory: int = envelope.MAX_JSON_MEMORY) -> dict:
    """A certificate path, its bytes, or an already-built dict, parsed and envelope-checked (BadInput on
    defects; parse memory at most `max_memory`). tcert-check reads a file's bytes once and hands them here,
    so that the certificate it reports on is the one it checked."""
    if isinstance(certificate, (bytes, bytearray)):
        return envelope.parse_certificate_bytes(bytes(certificate), max_memory)
    if isinstance(certificate, dict):
        try:
            data = json.dumps(certificate, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise BadInput(f"certificate: not serialisable as JSON ({e})") from None
        return envelope.parse_certificate_bytes(data, max_memory)
    return envelope.load_certificate(str(certificate), max_memory)


def verify(certificate, model, backend="flint", prec: int = DEFAULT_PREC,
           obligations: Obligations | None = None, limits: Limits = Limits()) -> Obligations:
    """Check `certificate` (a path, bytes or dict) against `model` (a path or a loaded Model) with `backend` (a
    name or a Backend; `prec` applies to names only), within the resource `limits` (checker/resources.py:
    the estimate is compared before any heavy work; the JSON reader may use an eighth of the memory).

    Returns the Obligations record (every obligation held; `.summary`, `.kind`, `.certificate`, `.statement`:
    the claim in words, which the certificate's own `statement` must equal); raises Rejected (an obligation
    failed, or another model) or BadInput (unusable input, or a check estimated beyond the limits). Pass your
    own `obligations` to keep the record of the obligations that held before a rejection (benchmarks)."""
    cert = read_certificate(certificate, int(limits.memory) // 8)
    check = checker_for(cert["kind"])
    model = model if isinstance(model, Model) else load_model(str(model))
    if model.sha256 != cert["model_sha256"]:
        raise Rejected("model binding", f"model file SHA-256 {model.sha256[:16]}... is not the certified "
                                        f"{cert['model_sha256'][:16]}...")
    B = backend if isinstance(backend, Backend) else make_backend(backend, prec)
    cost = cost_for(cert["kind"])(model.config, cert["claim"], cert["evidence"])
    resources.require_within(resources.at_precision(cost, B.prec), limits)
    ob = Obligations() if obligations is None else obligations
    ob.kind, ob.certificate = cert["kind"], cert
    with B.precision():     # every operation of the check at B's precision (see interval.py)
        check(model, cert["claim"], cert["evidence"], B, ob)
    check_statement(cert, model, ob)    # after the kind: its parse has validated the claim
    return ob
