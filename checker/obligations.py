"""The verify loop's record: each obligation checked, in order, with its time and certified figures.

A rule checks one obligation inside `step(name)`; it may record the numbers it certified into the
dict the step yields (e.g. `fig["certified margin"] = gap`). Those figures are what the CLI's --json,
reports and the mutation harness read: nobody needs to reach into a rule to learn what it proved.
"""

import time
from contextlib import contextmanager
from typing import Iterator, NamedTuple

from tcert.checker.errors import Rejected


class Obligation(NamedTuple):
    """One obligation that held: its name, the seconds it took and the figures it certified."""

    name: str
    seconds: float
    figures: dict


class Obligations:
    """Records each obligation a rule checks, in order; `summary` says in one line what was proved."""

    def __init__(self):
        self.done: list[Obligation] = []
        self.summary = ""       # set by the kind's check when every obligation held
        self.kind = ""          # set by verify
        self.certificate = {}   # the parsed certificate, set by verify
        self.statement = ""     # the claim in words, as the checker writes it (tcert.checker.statement)
        self.running = ""       # the obligation being checked now (read by tcert-check's progress line)

    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        """Time the block as obligation `name` and yield the dict of figures it certifies. A Rejected raised
        inside without an obligation name (`Rejected("", detail)`, or `require(holds, detail)`) is given
        this step's name, so an obligation's step name and its rejection name cannot differ."""
        figures = {}
        self.running = name
        start = time.perf_counter()
        try:
            yield figures
        except Rejected as e:
            if not e.obligation:
                e.obligation = name
                e.args = (f"{name}: {e.detail}",)
            raise
        self.done.append(Obligation(name, time.perf_counter() - start, figures))

    def require(self, holds: bool, *name_and_detail: str):
        """Reject unless `holds`: `require(holds, detail)` inside a step names the step's obligation;
        `require(holds, name, detail)` names one explicitly."""
        if not holds:
            name, detail = name_and_detail if len(name_and_detail) == 2 else ("", name_and_detail[0])
            raise Rejected(name, detail)

    def figure(self, key: str):
        """The first recorded figure called `key` (KeyError if no obligation recorded it)."""
        for ob in self.done:
            if key in ob.figures:
                return ob.figures[key]
        raise KeyError(key)
