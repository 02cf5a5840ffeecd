"""`tcert.checker.background`: work on a second thread returns exactly what the direct calls return, in order,
re-raises what they raised, and stays a bounded number of items ahead."""

import threading
import time

import pytest

from tcert.checker import background


def test_later_gives_each_value_or_error_in_order():
    """Each future holds its own call's value (a mix-up of jobs or results fails), an error stays with its job
    and the jobs after it still run."""
    def boom(x):
        raise ArithmeticError(f"job {x}")
    jobs = [(pow, (2, 10)), (boom, (1,)), (sorted, ([3, 1, 2],)), (divmod, (17, 5))]
    futures = background.later(jobs)
    assert futures[0].result() == 1024 and futures[2].result() == [1, 2, 3] and futures[3].result() == (3, 2)
    with pytest.raises(ArithmeticError, match="job 1"):
        futures[1].result()
    assert background.later([]) == []


def test_later_runs_on_a_daemon_thread():
    """The work runs off the calling thread, on a daemon (an exit never waits for it)."""
    seen = background.later([(lambda: (threading.current_thread() is threading.main_thread(),
                                       threading.current_thread().daemon), ())])[0].result()
    assert seen == (False, True)


def test_ahead_yields_every_value_in_order_and_stays_bounded():
    """fn(item) for every item, in order, with at most depth + 2 made and not yet taken (depth queued, one being
    made, one in the consumer's hands)."""
    made, taken = [], []

    def fn(x):
        made.append(x)
        return x * x
    for v in background.ahead(fn, list(range(12)), depth=2):
        time.sleep(0.01)         # a slow consumer: the thread must wait, not run on
        assert len(made) - len(taken) <= 4
        taken.append(v)
    assert taken == [x * x for x in range(12)]
    assert list(background.ahead(fn, [])) == []


def test_ahead_reraises_at_the_failing_item_and_stops_early():
    """An error reaches the consumer at its item (the values before it arrive first); a consumer that stops early
    ends the thread (no more items are made)."""
    def fn(x):
        if x == 3:
            raise ValueError("item 3")
        return x
    got = []
    with pytest.raises(ValueError, match="item 3"):
        for v in background.ahead(fn, list(range(6))):
            got.append(v)
    assert got == [0, 1, 2]
    made = []
    it = background.ahead(lambda x: made.append(x) or x, list(range(100)), depth=1)
    assert next(it) == 0
    it.close()
    time.sleep(0.5)
    assert len(made) <= 4


@pytest.mark.parametrize("name", ["neox1l-rotate-half", "llama-gqa", "preln-gelu"])
def test_no_backend_primitive_runs_off_the_main_thread(tmp_path, monkeypatch, name):
    """A whole prediction check (the weights' prefetch, the unembedding screen ahead) calls every backend primitive
    from the main thread only: python-flint's precision is one process-wide value that primitives set and restore,
    so a primitive on a second thread could change the precision under the main thread's feet (a prefetch that
    made its matrices with `B.array` fails here). The verdict and certified margin are those of a check with the
    second thread's work done inline."""
    from fractions import Fraction
    from tcert.checker import flint_backend, forward
    from tcert.checker.interval import MATRIX_HOOKS, PRIMITIVES
    from tcert.checker.kinds.prediction import gaps
    from tcert.checker.verify import verify
    from tcert.generator import certificate
    from tcert.generator.prediction import prediction_certificate
    from tcert.testing.prediction import build
    model = build(str(tmp_path), name, 0)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6][:model.config.n_ctx]
    cert, _ = prediction_certificate(model, tokens)
    path = tmp_path / "c.json"
    certificate.write(str(path), cert)
    callers = set()
    for prim in PRIMITIVES + MATRIX_HOOKS:
        method = getattr(flint_backend.FlintBackend, prim)

        def record(self, *args, _m=method):
            callers.add(threading.current_thread() is threading.main_thread())
            return _m(self, *args)
        monkeypatch.setattr(flint_backend.FlintBackend, prim, record)
    threaded = verify(str(path), model, "flint").figure("claim.margin")
    assert callers == {True}
    monkeypatch.setattr(forward.Weights, "prefetch", lambda self, layer: None)
    monkeypatch.setattr(gaps.background, "ahead", lambda fn, items: map(fn, items))
    inline = verify(str(path), model, "flint").figure("claim.margin")
    assert isinstance(threaded, Fraction) and threaded == inline
