"""tcert's Python API for notebooks: `import tcert.api as tc`.

    model = tc.load_model("m.safetensors")        # a path, a loaded Model, or a TransformerLens HookedTransformer
    cert = tc.predict(model, [3, 1, 4])           # one function per kind; each returns a Certificate
    cert.save("p.json"); cert.statement; cert.figures
    verdict = tc.check(cert, model)               # the independent checker (tcert.checker.verify.verify)
    verdict.verified, verdict.obligations, verdict.figure("claim.margin")

Errors callers can catch: BadInputError (malformed input; a subclass of the checker's BadInput),
InconclusiveError (the generator found no certificate to write: a near-tie, Inconclusive, a vacuous bound),
RejectedError (raised only by Verdict.raise_for_rejection; a subclass of the checker's Rejected). The `tcert`
command line is a thin layer over these functions (docs/api.md).
"""

from tcert.api.errors import BadInputError, InconclusiveError, RejectedError, TcertError
from tcert.api.models import import_model, load_model, random_model, save_model, train_maxofk
from tcert.api.results import Certificate, Verdict
from tcert.api.kinds import accuracy, influence, overwhelm, predict, text_tokens
from tcert.api.checking import check

__all__ = ["BadInputError", "Certificate", "InconclusiveError", "RejectedError", "TcertError", "Verdict",
           "accuracy", "check", "import_model", "influence", "load_model", "overwhelm", "predict", "random_model",
           "save_model", "text_tokens", "train_maxofk"]
