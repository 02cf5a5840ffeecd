"""`check`: the independent checker (tcert.checker.verify.verify) behind a Verdict object."""

import os
import time

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import BACKEND_NAMES, DEFAULT_PREC

from tcert.api.errors import BadInputError, bad_input
from tcert.api.models import load_model
from tcert.api.results import Certificate, Verdict

MIN_PREC, MAX_PREC = 30, 4096   # the range tcert-check accepts


def check(certificate, model=None, backend: str = "flint", prec: int = DEFAULT_PREC) -> Verdict:
    """Check `certificate` (a Certificate, a dict, or a path) against `model` (anything `load_model` takes;
    default: the Certificate's own model) with `backend` ("flint" or "mpmath") at `prec` bits.

    Returns a Verdict, VERIFIED or REJECTED (a failed obligation, or another model). Raises BadInputError when
    the certificate or the model cannot be read at all. The certificate goes through exactly the reader
    `tcert-check` uses, whatever form it is given in."""
    if isinstance(certificate, Certificate):
        model = certificate.model if model is None else model
        certificate = certificate.data
    elif isinstance(certificate, os.PathLike):
        certificate = os.fspath(certificate)
    if model is None:
        raise BadInputError("check: give the model the certificate binds to")
    if isinstance(backend, str) and backend not in BACKEND_NAMES:
        raise BadInputError(f"backend {backend!r} is not one of {', '.join(BACKEND_NAMES)}")
    if not isinstance(prec, int) or not MIN_PREC <= prec <= MAX_PREC:
        raise BadInputError(f"prec {prec!r} is not between {MIN_PREC} and {MAX_PREC} bits")
    from tcert.checker.obligations import Obligations
    from tcert.checker.verify import verify
    model = load_model(model)
    ob = Obligations()
    start = time.perf_counter()
    try:
        verify(certificate, model, backend, prec, obligations=ob)
    except Rejected as e:
        return Verdict(False, ob.kind, "", list(ob.done), backend, prec, time.perf_counter() - start,
                       e.obligation, e.detail)
    except BadInput as e:
        raise bad_input(e) from None
    return Verdict(True, ob.kind, ob.summary, list(ob.done), backend, prec, time.perf_counter() - start)
