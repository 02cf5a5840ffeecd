"""The verify loop's bookkeeping: named obligations, their outcome and their time."""

import time
from contextlib import contextmanager

from tcert.checker.errors import Rejected


class Obligations:
    """Records each obligation a rule checks, in order, with the seconds it took."""

    def __init__(self):
        self.done = []      # (name, seconds)
        self.summary = ""   # one line saying what was proved, set by the kind's check

    @contextmanager
    def step(self, name: str):
        """Time the block as obligation `name`; a Rejected inside it propagates unchanged."""
        start = time.perf_counter()
        yield
        self.done.append((name, time.perf_counter() - start))

    def require(self, holds: bool, name: str, detail: str):
        """Reject with `name: detail` unless `holds`."""
        if not holds:
            raise Rejected(name, detail)


def show(q) -> str:
    """A short human-readable decimal for an exact rational in a message (never used to decide)."""
    try:
        return f"{float(q):.9g}"
    except OverflowError:
        return "huge"
