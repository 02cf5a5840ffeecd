"""The execution layer of every `tcert experiment`: cells run as tasks on Dask distributed, results go
into a resumable log as they finish.

A *cell* is one task: generate and check one certificate, or train one seed. Its function is a
module-level `fn(task, *inputs) -> row` (a JSON-able dict; an optional "files" entry maps paths relative
to the run folder to bytes, which the driver writes there before it logs the row). Nothing a cell needs
is read from the driver's disk on the worker:

- models travel as bytes (`File` -> `Blob`, content-addressed by SHA-256, parsed and
  cached once per worker process), so workers need no shared file system, only `tcert` installed;
- a file one cell makes for another (a trained seed) is a `Produced` input: the consumer gets the bytes
  straight from the producer's result on the cluster, and the driver also writes it into the run folder,
  so a resumed run ships the file instead of training again;
- certificates a row keeps come back as bytes and land in the run folder under a relative path.

So a run folder is self-contained and holds only relative paths: it can move to another machine and be
resumed there on another cluster. Default cluster: a `LocalCluster` of `--jobs` single-threaded worker
processes; `--scheduler tcp://HOST:PORT` uses an existing one (its workers need this `tcert`).

The log (`<run>/<name>.jsonl`, one strict-JSON row per line; the last row of an id wins) is written
only by the driver, as each task finishes; a resume skips every logged id except those whose cell
ended for a reason of the run, not of the cell ("timeout", "worker lost"; with `--retry-failed` every
failure). A lock file keeps a second driver off the same log. Every row records `status` ("done", or the
failure class of the cell: ERROR, INTERNAL ERROR, timeout, worker lost), `detail`, the `worker` that ran
it and `cell_seconds`; a check inside a cell records its verdict in the same classes (`check_outcome`).
"""

import fcntl
import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from tcert.generator.experiments import families

RETRIED = ("timeout", "worker lost")          # the run's fault, not the cell's: a resume tries again
FAILURE_CLASSES = ("REJECTED", "ERROR", "INTERNAL ERROR", "timeout", "worker lost")
MAX_CACHED_MODELS = 4                          # parsed models kept per worker process


# ---------------------------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class File:
    """A file on the driver's disk (absolute, or relative to the run folder): a model or a certificate.
    The cell receives its bytes as a Blob."""
    path: str


@dataclass(frozen=True)
class Produced:
    """The file `path` (relative to the run folder) that cell `cell` writes (e.g. a trained model)."""
    cell: str
    path: str


@dataclass(frozen=True)
class Blob:
    """A file's bytes as they reach a worker, with their SHA-256."""
    sha256: str
    data: bytes = field(repr=False)


def blob(data: bytes) -> Blob:
    """The Blob of some bytes."""
    return Blob(hashlib.sha256(data).hexdigest(), data)


_MODELS = {}


def model_of(shipped: Blob):
    """The parsed Model of a shipped model file (parsed once per worker process, keyed by SHA-256)."""
    model = _MODELS.get(shipped.sha256)
    if model is None:
        model = families.parse_model_bytes(shipped.data)
        if model.sha256 != shipped.sha256:
            raise RuntimeError("shipped model bytes changed in transit")
        while len(_MODELS) >= MAX_CACHED_MODELS:
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[shipped.sha256] = model
    return model


def _produced_bytes(row, path):
    """Worker: the bytes of file `path` out of the producing cell's row (a failed producer: ERROR)."""
    files = row.get("files") or {}
    if path not in files:
        raise InputMissing(row["status"], f"input {row['id']} ended with {row['status']}: {row.get('detail')}")
    return blob(files[path])


def _ship(data):
    """Worker: identity. Submitting the bytes as a task argument keeps them in the task's spec, so the
    scheduler can recompute them if the worker holding them dies (scattered data would be lost)."""
    return data


class InputMissing(Exception):
    """A cell's input was never made: its producer ended with `status` (the consumer inherits a status
    a resume retries, so both run again; otherwise it is an ERROR)."""

    def __init__(self, status, detail):
        super().__init__(status, detail)
        self.status, self.detail = status, detail

    def __str__(self):
        return self.detail


# ------------------------------------------------------------------------------------------- outcomes

def classify(exc) -> tuple:
    """(failure class, detail) of an exception raised inside a cell, worded as tcert-check words it."""
    Rejected, BadInput = families.checker_errors()
    if isinstance(exc, Rejected):
        return "REJECTED", f"{exc.obligation}: {exc.detail}"
    if isinstance(exc, (BadInput, InputMissing)):
        return "ERROR", str(exc)
    if isinstance(exc, (MemoryError, RecursionError)):
        return "ERROR", f"input exhausted a resource limit ({type(exc).__name__})"
    return "INTERNAL ERROR", f"{type(exc).__name__}: {str(exc)[:300]}"


def check_outcome(certificate, model, backend) -> dict:
    """Run the checker on one certificate; {"checked": "VERIFIED" | "<CLASS>: detail", "check_seconds",
    "check_cpu"} (CPU of this thread: the worker's other threads do not count)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        families.verify(certificate, model, backend)
        verdict = "VERIFIED"
    except Exception as e:   # every way a check can end is a result to record, with its class
        verdict = "%s: %s" % classify(e)
    return {"checked": verdict, "check_seconds": time.perf_counter() - wall, "check_cpu": time.thread_time() - cpu}


def verdict_class(checked) -> str | None:
    """The class of a recorded verdict ("VERIFIED", "REJECTED", ..., "timeout"); None if not checked."""
    if checked is None:
        return None
    for name in ("VERIFIED",) + FAILURE_CLASSES:
        if checked == name or checked.startswith(name + ":"):
            return name
    return "INTERNAL ERROR"


# -------------------------------------------------------------------------------------- strict JSON

def strict(obj):
    """`obj` with NaN / infinities as None and numpy scalars as Python numbers (strict JSON only)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):      # numpy scalar
        return strict(obj.item())
    return obj


def dumps(obj, **kw) -> str:
    return json.dumps(strict(obj), allow_nan=False, **kw)


def write_json(path, obj):
    with open(path, "w") as f:
        f.write(dumps(obj, indent=1, sort_keys=True) + "\n")


# -------------------------------------------------------------------------------------- worker side

def _worker_address():
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return None


def _guarded(fn, task, inputs):
    """Run one cell; every exception becomes a row with its class (the task itself never fails)."""
    try:
        row = dict(fn(task, *inputs))
        row.setdefault("status", "done")
        row.setdefault("detail", None)
    except Exception as e:
        status, detail = classify(e)
        row = {"status": status, "detail": detail}
    return row


def run_task(fn, task, inputs, timeout):
    """Worker: one cell, in this process, or with `timeout` in a child process killed at expiry."""
    start = time.perf_counter()
    worker = _worker_address()
    if timeout is None:
        row = _guarded(fn, task, inputs)
    else:
        row = _in_child(fn, task, inputs, timeout)
    row.update(id=task["id"], worker=worker, cell_seconds=time.perf_counter() - start)
    return row


def _in_child(fn, task, inputs, timeout):
    payload = pickle.dumps((fn, task, inputs))
    cmd = [sys.executable, "-c", "from tcert.generator.experiments.execution import child_main; child_main()"]
    try:
        done = subprocess.run(cmd, input=payload, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "detail": f"cell exceeded --timeout {timeout:g} s"}
    if done.returncode != 0 or not done.stdout:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"status": "INTERNAL ERROR", "detail": f"cell process exited {done.returncode}: {tail[0][:300]}"}
    return pickle.loads(done.stdout)   # our own child's output, never a user's file


def child_main():
    """Child process of a timed cell: pickled (fn, task, inputs) on stdin, the row pickled on stdout."""
    fn, task, inputs = pickle.loads(sys.stdin.buffer.read())
    row = _guarded(fn, task, inputs)
    sys.stdout.buffer.write(pickle.dumps(row))


# -------------------------------------------------------------------------------------------- the log

def read_log(path, repair=True) -> dict:
    """id -> last row of the log at `path`. A torn last line (a killed driver, or one still writing) is
    ignored; with `repair` (the writer, holding the lock) it is cut, so appends start on a fresh line."""
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        if repair:
            with open(path, "r+b") as f:
                f.truncate(len(data))
    for line in data.decode().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["id"]] = row
    return rows


def finished(row, retry_failed=False) -> bool:
    """Whether a logged row counts as done for a resume."""
    status = row.get("status", "done")      # logs written before the layer had no status: done cells
    if status == "done":
        return True
    return status not in RETRIED and not retry_failed


def _relative(path):
    """A path a cell names for a file: relative to the run folder (a run folder holds no absolute path;
    ".." is allowed for a certificate folder the user put beside the run folder)."""
    if os.path.isabs(path):
        raise ValueError(f"a cell names files relative to the run folder (got {path!r})")
    return os.path.normpath(path)


def _write_files(run_dir, files):
    """Write a row's files (relative path -> bytes) into the run folder, each atomically."""
    for rel, data in files.items():
        path = os.path.join(run_dir, _relative(rel))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.replace(path + ".part", path)


# ------------------------------------------------------------------------------------------ the driver

@dataclass
class Cell:
    """One task: `fn(task, *inputs)` on a worker; `task["id"]` is its stable id in the log."""
    fn: object
    task: dict
    inputs: tuple = ()
    priority: int = 0

    @property
    def id(self):
        return self.task["id"]


@dataclass
class Options:
    jobs: int = 2
    scheduler: str | None = None
    timeout: float | None = None
    quiet: bool = False
    retry_failed: bool = False


def options(args) -> Options:
    """Options from the parsed `add_arguments` flags."""
    return Options(args.jobs, args.scheduler, args.timeout, args.quiet, args.retry_failed)


def add_arguments(p, jobs=2):
    """The execution flags every experiment takes."""
    g = p.add_argument_group("execution (Dask)")
    g.add_argument("--jobs", type=int, default=jobs, help="worker processes of the local Dask cluster")
    g.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="run on an existing Dask cluster instead (its workers need this tcert installed)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per cell: run each cell in a child process, killed (and logged 'timeout') at expiry")
    g.add_argument("--retry-failed", action="store_true",
                   help="a resume also re-runs cells logged with a failure (default: only timeout / worker lost)")
    g.add_argument("--quiet", action="store_true", help="no progress bar (also off when stderr is not a TTY)")


class Executor:
    """A Dask client (opened on first use) that runs lists of cells into resumable logs."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.client = None
        self.cluster = None
        self.token = uuid.uuid4().hex[:8]      # task keys of this driver are unique on a shared scheduler
        self.shipped = {}                      # SHA-256 -> future of a file's Blob, kept across runs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def _client(self):
        if self.client is None:
            from distributed import Client, LocalCluster
            if self.opts.scheduler:
                self.client = Client(self.opts.scheduler, timeout="60s")
            else:
                import logging
                self.cluster = LocalCluster(n_workers=max(1, self.opts.jobs), threads_per_worker=1,
                                            processes=True, dashboard_address=":0", scheduler_port=0,
                                            silence_logs=logging.ERROR)
                self.client = Client(self.cluster)
        return self.client

    def run(self, run_dir, log_name, cells, desc="cells"):
        """Run every cell of `cells` not yet finished in `<run_dir>/<log_name>`; return id -> row for all
        of them. Rows are appended as tasks finish (files first, then the row)."""
        os.makedirs(run_dir, exist_ok=True)
        log_path = os.path.join(run_dir, log_name)
        with open(log_path + ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _, BadInput = families.checker_errors()
                raise BadInput(f"another tcert experiment is writing {log_path}") from None
            done = {k: r for k, r in read_log(log_path).items() if finished(r, self.opts.retry_failed)}
            todo = [c for c in cells if c.id not in done]
            if todo:
                self._stream(run_dir, log_path, cells, todo, done, desc)
        return {c.id: done[c.id] for c in cells if c.id in done}

    def _stream(self, run_dir, log_path, cells, todo, done, desc):
        from distributed import as_completed
        from tqdm import tqdm
        client = self._client()
        token = self.token
        futures, produced, read = {}, {}, {}
        producers = {c.id: c for c in todo}
        order = {}

        def resolve(inp):
            if isinstance(inp, Produced) and inp.cell in futures and inp.cell not in done:
                key = (inp.cell, inp.path)
                if key not in produced:
                    produced[key] = client.submit(_produced_bytes, futures[inp.cell], inp.path,
                                                  key=f"input-{inp.cell}-{token}", priority=order[inp.cell])
                return produced[key]
            path = os.path.abspath(inp.path if os.path.isabs(inp.path) else os.path.join(run_dir, inp.path))
            if path not in read:       # each file is read and hashed once per run, shipped once per driver
                with open(path, "rb") as f:
                    data = blob(f.read())
                if data.sha256 not in self.shipped:
                    self.shipped[data.sha256] = client.submit(_ship, data, key=f"file-{data.sha256[:16]}-{token}")
                read[path] = self.shipped[data.sha256]
            return read[path]

        for c in sorted(todo, key=lambda c: any(isinstance(i, Produced) for i in c.inputs)):
            for inp in c.inputs:
                if isinstance(inp, Produced) and inp.cell not in done and inp.cell not in producers:
                    raise ValueError(f"cell {c.id} needs {inp.cell}, which is not in this run")
            order[c.id] = c.priority
            futures[c.id] = client.submit(run_task, c.fn, c.task, tuple(resolve(i) for i in c.inputs),
                                          self.opts.timeout, key=f"cell-{c.id}-{token}", priority=c.priority,
                                          pure=False)
        ids = {f.key: cid for cid, f in futures.items()}
        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=desc, file=sys.stderr,
                   disable=self.opts.quiet or not sys.stderr.isatty(), mininterval=1.0, smoothing=0.05)
        with open(log_path, "a") as out, bar:
            for fut in as_completed(list(futures.values())):
                cid = ids[fut.key]
                if fut.status == "finished":
                    row = fut.result()
                else:
                    row = self._lost(cid, fut)
                fut.release()
                if cid in done:      # a result can reach the driver only once; never log an id twice
                    continue
                _write_files(run_dir, row.pop("files", None) or {})
                out.write(dumps(row) + "\n")
                out.flush()
                done[cid] = row
                bar.update(1)

    @staticmethod
    def _lost(cid, fut):
        """The row of a task the cluster could not finish (its workers died, or it was cancelled)."""
        from distributed import KilledWorker
        try:
            exc = fut.exception()
        except Exception as e:      # cancelled: the scheduler forgot it
            exc = e
        if isinstance(exc, KilledWorker):
            status, detail = "worker lost", str(exc)[:300]
        elif isinstance(exc, InputMissing) and exc.status in RETRIED:
            status, detail = exc.status, exc.detail
        else:
            status, detail = classify(exc)
        return {"id": cid, "status": status, "detail": detail, "worker": None, "cell_seconds": None}
