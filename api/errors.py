"""The API's exceptions: one base class, and subclasses of the checker's own BadInput / Rejected so that code
written against either layer catches both."""

import functools

from tcert.checker.errors import BadInput, Rejected


class TcertError(Exception):
    """Base class of every error the API raises on purpose."""


class BadInputError(TcertError, BadInput):
    """The model, the certificate or an argument is unusable (`tcert` exit 2)."""


class RejectedError(TcertError, Rejected):
    """An obligation of a certificate failed (raised by Verdict.raise_for_rejection; `tcert-check` exit 1)."""


class InconclusiveError(TcertError):
    """The generator found no certificate to write (`tcert` exit 4): `reason` says why, `figures` holds what
    it computed (e.g. the float gap of a near-tie)."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.figures = dict(figures or {})


def bad_input(message) -> BadInputError:
    """A BadInputError with the message of `message` (a string or an exception)."""
    return BadInputError(str(message))


def translating(fn):
    """Re-raise the checker's and the generator's BadInput (and an importer's ValueError) as BadInputError."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TcertError:
            raise
        except BadInput as e:
            raise bad_input(e) from None
    return wrapper
