"""Work on a second thread, for speed only: nothing here decides anything.

A check is mostly one thread of numpy, BLAS and Arb calls. Some of its inputs depend on the weights alone (a
weight matrix's spectral norm, its exact digit cut, the unembedding's first digit per block) and their
work is numpy and BLAS calls, which release Python's GIL; computed on a second thread while the main thread
does the forward pass, they are ready when it needs them, and the check takes less wall time on a machine
with a second core (the same CPU time on one core).

The contract, which is all an auditor needs from this module: `later(jobs)` and `ahead(fn, items)` return
exactly what calling the functions directly returns, in order, and re-raise exactly what they raised; the
main thread waits for each value before it uses it, and no value is shared with the thread while it is
being written. The threads are daemons: an exit (a verdict, --timeout) never waits for them.
"""

import queue
import threading
from concurrent.futures import Future


def later(jobs: list) -> list:
    """[Future of fn(*args) for (fn, args) in jobs], computed one after another on one daemon thread; each
    future holds the value or the exception its call gave (`Future.result()` returns or raises it)."""
    futures = [Future() for _ in jobs]

    def work():
        for future, (fn, args) in zip(futures, jobs):
            try:
                future.set_result(fn(*args))
            except BaseException as e:      # re-raised by result() in the thread that needs the value
                future.set_exception(e)
    if jobs:
        threading.Thread(target=work, daemon=True).start()
    return futures


def ahead(fn, items: list, depth: int = 2):
    """Yield fn(item) for each item in order, computed on a daemon thread at most `depth` items ahead of the
    consumer: at most depth + 2 results exist at once (depth queued, one being made, one the consumer holds), so
    memory stays bounded."""
    done: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        for item in items:
            future = Future()
            try:
                future.set_result(fn(item))
            except BaseException as e:
                future.set_exception(e)
            while not stop.is_set():
                try:
                    done.put(future, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
    threading.Thread(target=work, daemon=True).start()
    try:
        for _ in items:
            yield done.get().result()
    finally:
        stop.set()      # the consumer stopped early (an exception): the thread ends after its current item
