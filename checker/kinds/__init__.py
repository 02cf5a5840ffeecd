"""Certificate kinds: each module exposes `check(model, claim, evidence, backend, obligations)`.

`check` raises `Rejected` when an obligation fails and `BadInput` when the claim or evidence does not
have the kind's shape; when it returns, every obligation held and `obligations.summary` says what
was proved.
"""

import importlib

from tcert.checker.errors import BadInput

KINDS = ("prediction", "overwhelm", "accuracy", "influence")


def checker_for(kind: str):
    """The `check` function of certificate kind `kind`."""
    if kind not in KINDS:
        raise BadInput(f"certificate: unknown kind {kind[:40]!r} (known: {', '.join(KINDS)})")
    try:
        module = importlib.import_module(f"{__name__}.{kind}")
    except ModuleNotFoundError:
        raise BadInput(f"certificate: kind {kind!r} is not supported by this checker build") from None
    return module.check


def cost_for(kind: str):
    """The `cost(cfg, claim, evidence) -> resources.Cost` estimate of (known) kind `kind`."""
    return importlib.import_module(f"{__name__}.{kind}.cost").cost
