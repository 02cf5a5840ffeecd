"""What tcert-check does around a check without deciding anything: the progress line on stderr, the
--timeout clock, the versions a verdict depends on, the certified figures as exact JSON, and how the process's
allocator reuses freed memory (`keep_freed_memory`).

The clock interrupts the main thread (KeyboardInterrupt, which no rule catches), repeatedly, and marks itself
expired; tcert.checker.cli turns that into ERROR (exit 2), and a check that ends after expiry is ERROR too,
never a verdict.
"""

import os
import platform
import sys
import threading
import time
import _thread
from fractions import Fraction

from tcert.checker import __version__
from tcert.checker.errors import BadInput
from tcert.checker.obligations import Obligations
from tcert.checker.numbers import show

PROGRESS_AFTER, PROGRESS_EVERY = 2.0, 0.5    # seconds
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                    # glibc's largest mmap threshold on 64-bit (its dynamic ceiling)
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """On glibc, let blocks below MMAP_THRESHOLD come from the heap and let freed heap memory stay with the
    process up to TRIM_THRESHOLD (mallopt); True when both settings took. The checker's numpy temporaries (a
    few MB each, made and freed hundreds of times in a paper-scale check) then reuse pages of the heap instead
    of each being mapped, zero-filled page by page on first touch and unmapped again: at paper scale ~110,000
    page faults become ~72,000 and ~0.15 s of system time goes (benchmarks/bench_prediction.py). The peak
    (VmHWM) stays the same: a freed page is reused, not added. Decides nothing: a different allocator setting
    gives the same values, only at another speed. Elsewhere (no glibc: macOS, musl, Windows) a no-op."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes     # already imported by numpy: no extra start-up time
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (AttributeError, OSError, ValueError, TypeError):
        return False


def versions() -> dict:
    """The versions a verdict depends on: this tool, Python and the three libraries."""
    out = {"tcert": __version__, "python": platform.python_version()}
    for name, module in (("numpy", "numpy"), ("mpmath", "mpmath"), ("python-flint", "flint")):
        try:
            out[name] = str(__import__(module).__version__)
        except ImportError:
            out[name] = "not installed"
    return out


def obligations_json(ob: Obligations) -> list:
    """Each obligation that held, in order: name, seconds and certified figures (exact numbers as text)."""
    return [{"name": o.name, "seconds": round(o.seconds, 6), "figures": exact_json(o.figures)} for o in ob.done]


def exact_json(value):
    """A figure as JSON: integers and rationals as exact text ("17", "-7/16"), containers element-wise."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, Fraction)):
        q = Fraction(value)
        # beyond Python's 4,300-digit limit on decimal text, exact hexadecimal ("0x1f/0x3"): same value
        text = hex if max(q.numerator.bit_length(), q.denominator.bit_length()) > 12000 else str
        return text(q.numerator) if q.denominator == 1 else f"{text(q.numerator)}/{text(q.denominator)}"
    if isinstance(value, dict):
        return {str(k): exact_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [exact_json(v) for v in value]
    return str(value)[:200]


class Deadline:
    """--timeout: after `seconds`, interrupt the main thread (KeyboardInterrupt, which no rule catches) and
    mark the deadline expired, so that the interrupt reads as a timeout and never as a verdict.

    Libraries may swallow a KeyboardInterrupt (mpmath's `convert` and interval comparisons wrap conversions in
    a bare `except:`), so the clock repeats the interrupt every RESEND seconds until the check stops, and a
    block that ends after the deadline expired ends as the timeout whatever it computed: no verdict is
    reported once the clock has run out (a swallowed interrupt may have changed what a library returned)."""

    RESEND = 0.05

    def __init__(self, seconds):
        self.seconds, self.expired, self.timer, self.start = seconds, False, None, time.perf_counter()
        self.lock, self.stopped = threading.Lock(), threading.Event()

    def _fire(self):
        self.expired = True
        while True:
            with self.lock:     # cancel() holds the lock: no interrupt is sent once it returned
                if self.stopped.is_set():
                    return
                _thread.interrupt_main()
            if self.stopped.wait(self.RESEND):
                return

    def __enter__(self):
        if self.seconds is not None:
            self.timer = threading.Timer(self.seconds, self._fire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def cancel(self):
        """Stop the timer and its repeated interrupts; one already sent is absorbed by __exit__."""
        with self.lock:
            self.stopped.set()
        if self.timer is not None:
            self.timer.cancel()

    def __exit__(self, exc_type, *exc):
        try:
            self.cancel()
        except KeyboardInterrupt:   # the clock's last interrupt, delivered while stopping it
            pass
        if self.expired and (exc_type is None or issubclass(exc_type, (KeyboardInterrupt, BadInput))):
            raise BadInput(f"the check did not finish within --timeout {show(Fraction(self.seconds))} s") from None
        return False


class Progress:
    """A progress line on stderr (elapsed seconds, obligations done, the one running) while a check runs past
    PROGRESS_AFTER seconds; only when stderr is a terminal and --quiet is not given. Erased at the end."""

    def __init__(self, args, ob: Obligations):
        self.ob, self.stop, self.shown = ob, threading.Event(), False
        self.on = not args.quiet and sys.stderr.isatty()

    def _run(self):
        start = time.perf_counter()
        while not self.stop.wait(PROGRESS_AFTER if not self.shown else PROGRESS_EVERY):
            running = "".join(c if c.isascii() and c.isprintable() else "?" for c in self.ob.running)[:70]
            sys.stderr.write(f"\r\x1b[Ktcert-check: {time.perf_counter() - start:5.1f} s, {len(self.ob.done)} "
                             f"obligation(s) held; checking: {running}")
            sys.stderr.flush()
            self.shown = True

    def __enter__(self):
        if self.on:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.on:
            self.stop.set()
            self.thread.join()
            if self.shown:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
        return False
