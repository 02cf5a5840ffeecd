"""Every experiment on a real Dask cluster: a scheduler and workers started as separate processes on
127.0.0.1 (`python -m distributed.cli.dask_scheduler / dask_worker`), the sweeps run through --scheduler.

Asserted: cells run on the cluster's workers (each row records its worker) and give the rows a local run
gives (everything but times and worker names); a run folder moved elsewhere resumes on another cluster
without recomputing a logged cell; a worker killed mid-run loses nothing and logs nothing twice; with
no retries left the killed cell is logged "worker lost" and a resume re-runs exactly that cell; a cell
over --timeout is logged "timeout" and retried on resume; checker failures keep their class.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tcert.testing import CERTIFICATES
from tcert.generator.cli import main
from tcert.generator.experiments import execution

distributed = pytest.importorskip("distributed")

VOLATILE = {"worker", "cell_seconds", "gen_seconds", "gen_cpu", "check_seconds", "check_cpu", "train_seconds",
            "train_cpu", "est_seconds"}
STARTUP = 120        # seconds a process of the cluster may take to come up on a loaded machine
RUN = 600            # seconds a small sweep may take on a loaded machine
# d_vocab 16: brute force over 16^4 inputs, so every kind of cell (train, brute, cubic, subcubic) stays cheap
MAXOFK = ["--d-vocab", "16", "--steps", "100", "--strategies", "brute,cubic,subcubic:svd", "--quiet"]
SEEDS = 6


def wait_until(what, condition, timeout):
    """Poll `condition` until it holds (a deadline, not a fixed sleep: it returns as soon as it holds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class Cluster:
    """A scheduler and named workers (each a single process, no nanny) on 127.0.0.1, random ports."""

    def __init__(self, folder, n_workers):
        self.folder = folder
        self.procs, self.workers = [], {}
        sched_file = folder / "scheduler.json"
        self.procs.append(self._start("scheduler", ["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                                    "--port", "0", "--no-dashboard", "--scheduler-file",
                                                    str(sched_file)]))
        wait_until("scheduler file", lambda: sched_file.exists() and sched_file.stat().st_size > 0, STARTUP)
        wait_until("scheduler address", lambda: "address" in self._read(sched_file), STARTUP)
        self.address = self._read(sched_file)["address"]
        for i in range(n_workers):
            self.workers[f"w{i}"] = self._start(f"w{i}", ["distributed.cli.dask_worker", self.address,
                                                          "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                                          "--name", f"w{i}", "--memory-limit", "0"])
        self.procs += list(self.workers.values())
        self.client = distributed.Client(self.address, timeout=STARTUP)
        self.client.wait_for_workers(n_workers, timeout=STARTUP)

    def _start(self, name, args):
        log = open(self.folder / f"{name}.log", "w")
        return subprocess.Popen([sys.executable, "-m"] + args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    @staticmethod
    def _read(path):
        try:
            return json.loads(path.read_text())
        except ValueError:
            return {}

    def addresses(self):
        """name -> address of the workers alive now."""
        return {w["name"]: a for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()}

    def close(self):
        """Kill every process (no graceful shutdown needed: the tests have read what they need)."""
        self.client.close()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), 2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def other_cluster(tmp_path_factory):
    """A second cluster (three workers): where moved runs resume, and where workers get killed."""
    c = Cluster(tmp_path_factory.mktemp("other"), 3)
    yield c
    c.close()


def log_rows(folder, name="cells.jsonl"):
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def stable(rows):
    """id -> row without times and worker: what must not depend on where a cell ran."""
    return {r["id"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in rows}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The reference: seeds 0-5 of a small Max-of-K sweep on the default local cluster (--jobs 2)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("local") / "run"
    assert main(["experiment", "maxofk-sweep", "--out-dir", str(out), "--seeds", f"0-{SEEDS - 1}", "--jobs", "2"]
                + MAXOFK) == 0
    rows = log_rows(out)
    assert len(rows) == SEEDS * 4 and all(r["status"] == "done" for r in rows)
    assert all(r["checked"] == "VERIFIED" for r in rows if r["kind"] == "strategy")
    return out


@pytest.fixture(scope="module")
def local_maxofk(local_run):
    return stable(log_rows(local_run))


def with_models(local_run, out, seeds):
    """A run folder that already holds the trained models of `seeds` (copied from the reference run), so
    its cells need no training (and its workers no torch)."""
    (out / "models").mkdir(parents=True)
    for seed in seeds:
        name = f"maxof4_v16_s100_seed{seed}.safetensors"
        shutil.copy(local_run / "models" / name, out / "models" / name)
    return out


def cells_of(rows, seeds):
    """The strategy cells of `seeds` in a stable-rows dict."""
    return {k: v for k, v in rows.items() if v.get("kind") == "strategy" and v["seed"] in seeds}


def test_maxofk_sweep_runs_on_the_cluster_and_resumes_elsewhere(cluster, other_cluster, local_run, local_maxofk,
                                                                 tmp_path):
    out = tmp_path / "run"
    argv = ["experiment", "maxofk-sweep", "--out-dir", str(out), "--scheduler", cluster.address] + MAXOFK
    assert main(argv + ["--seeds", "0-1"]) == 0          # training included: a seed is a task too
    rows = log_rows(out)
    assert len(rows) == 2 * 4
    assert {r["worker"] for r in rows} <= set(cluster.addresses().values())
    assert stable(rows) == {k: v for k, v in local_maxofk.items() if v["seed"] in (0, 1)}
    for name in ("table.md", "summary.json", "per_seed.csv", "bound_vs_cost.png"):
        assert (out / name).stat().st_size > 100
    assert not any(os.path.isabs(r.get("model", "")) for r in rows)
    # The run folder moves (another path, as on another machine; seed 2's model put in by hand) and resumes
    # on another cluster with one more seed: nothing logged is recomputed, the trained seeds are reused.
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(out, moved)
    shutil.copy(local_run / "models" / "maxof4_v16_s100_seed2.safetensors", moved / "models")
    before = (moved / "cells.jsonl").read_text()
    assert main(["experiment", "maxofk-sweep", "--out-dir", str(moved), "--scheduler", other_cluster.address,
                 "--seeds", "0-2"] + MAXOFK) == 0
    after = (moved / "cells.jsonl").read_text()
    assert after.startswith(before)
    new = [json.loads(line) for line in after[len(before):].splitlines()]
    assert sorted(r["id"] for r in new) == sorted(cells_of(local_maxofk, (2,)))
    assert {r["worker"] for r in new} <= set(other_cluster.addresses().values())
    assert stable(log_rows(moved)) == {k: v for k, v in local_maxofk.items()
                                       if v["seed"] in (0, 1) or k in cells_of(local_maxofk, (2,))}
    text = (moved / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))   # strict JSON
    assert summary["seeds_complete"] == 3 and summary["failures"] == []


def test_overwhelm_experiments_on_the_cluster_equal_local(cluster, tmp_path):
    from tcert.generator.model.files import save_model
    from tcert.testing.overwhelm import tiny_neox1l
    tensors, cfg = tiny_neox1l(seed=11, d_vocab=5, qk_scale=0.3, n_ctx=2048)
    cfg = dict(cfg, positional_embedding_type="none")
    cfg.pop("rotary_dim")
    nope = tmp_path / "nope.safetensors"
    save_model(str(nope), tensors, cfg)
    small = str(CERTIFICATES / "models" / "text_small.safetensors")
    paper = ["experiment", "overwhelm-paper", "--model", small, "--lengths", "10", "--samples", "1", "--free",
             "blotches", "--methods", "naive", "--generate", "1", "--corpus", "lee", "--no-check", "--quiet"]
    rep = ["experiment", "overwhelm-repetition", "--model", str(nope), "--tokens", "0 3", "--n-free", "2",
           "--lengths", "1,100,1000", "--quiet"]
    for argv, logs in ((paper, ("cells.jsonl", "generation.jsonl")), (rep, ("cells.jsonl",))):
        there, here = tmp_path / f"{argv[1]}-cluster", tmp_path / f"{argv[1]}-local"
        assert main(argv + ["--out-dir", str(there), "--scheduler", cluster.address]) == 0
        assert main(argv + ["--out-dir", str(here), "--jobs", "1"]) == 0     # the default: a local cluster
        for name in logs:
            rows = log_rows(there, name)
            assert rows and {r["worker"] for r in rows} <= set(cluster.addresses().values())
            assert stable(rows) == stable(log_rows(here, name))
        for r in log_rows(there):
            if r["certificate"]:       # certificates came back from the workers into the run folder
                assert not os.path.isabs(r["certificate"])
                assert (there / r["certificate"]).read_bytes() == (here / r["certificate"]).read_bytes()
    assert any(r["checked"] == "VERIFIED" for r in log_rows(tmp_path / "overwhelm-repetition-cluster"))


def test_a_killed_worker_loses_nothing_and_logs_nothing_twice(other_cluster, local_run, local_maxofk, tmp_path):
    c = other_cluster
    seeds = list(range(SEEDS))
    want = cells_of(local_maxofk, seeds)

    def sweep(out, seeds):
        return subprocess.Popen([sys.executable, "-c", "from tcert.generator.cli import run; run()",
                                 "experiment", "maxofk-sweep", "--out-dir", str(out), "--seeds", seeds,
                                 "--scheduler", c.address] + MAXOFK,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def kill_a_busy_worker(out, driver):
        """Once two rows are logged, kill a worker that is running a cell; return its name."""
        names = {a: n for n, a in c.addresses().items()}

        def busy():   # the driver is appending to the log: count complete lines only
            log = out / "cells.jsonl"
            if not log.exists() or log.read_text().count("\n") < 2:
                return None
            for addr, keys in c.client.processing().items():
                if any(str(k).startswith("cell-") for k in keys) and addr in names:
                    return names[addr]
            return None
        wait_until("a busy worker", lambda: busy() is not None or driver.poll() is not None, RUN)
        victim = busy()
        assert victim is not None and driver.poll() is None, "the sweep ended before a worker could be killed"
        c.workers[victim].kill()
        c.workers[victim].wait(30)
        return victim

    # 1. Default retries: the killed worker's cell runs again elsewhere; the sweep completes.
    out = with_models(local_run, tmp_path / "run", seeds)
    driver = sweep(out, f"0-{SEEDS - 1}")
    victim = kill_a_busy_worker(out, driver)
    output, _ = driver.communicate(timeout=RUN)
    assert driver.returncode == 0, output
    rows = log_rows(out)
    assert len(rows) == len({r["id"] for r in rows}) == len(want)      # nothing twice
    assert stable(rows) == want                                          # nothing lost
    assert all(r["status"] == "done" for r in rows)
    # 2. No retries left (allowed-failures 0): the killed cell is logged "worker lost", the rest finish;
    # a resume re-runs exactly the lost cells.
    c.client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", 0))
    out = with_models(local_run, tmp_path / "run2", seeds)
    driver = sweep(out, f"0-{SEEDS - 1}")
    second = kill_a_busy_worker(out, driver)
    assert second != victim
    output, _ = driver.communicate(timeout=RUN)
    assert driver.returncode == 1, output       # a sweep with a failed cell says so
    rows = log_rows(out)
    lost = [r for r in rows if r["status"] == "worker lost"]
    assert lost and all(r["worker"] is None for r in lost)
    assert len(rows) == len({r["id"] for r in rows}) == len(want)
    resume = sweep(out, f"0-{SEEDS - 1}")
    output, _ = resume.communicate(timeout=RUN)
    assert resume.returncode == 0, output
    again = log_rows(out)[len(rows):]
    assert sorted(r["id"] for r in again) == sorted(r["id"] for r in lost)
    assert stable(execution.read_log(out / "cells.jsonl").values()) == want


def test_timeout_is_logged_and_retried(cluster, local_run, local_maxofk, tmp_path):
    out = with_models(local_run, tmp_path / "run", [0])
    argv = ["experiment", "maxofk-sweep", "--out-dir", str(out), "--seeds", "0", "--scheduler", cluster.address]
    # 0.2 s cannot even start the checker in the cell's child process: every cell is killed and logged.
    assert main(argv + MAXOFK + ["--timeout", "0.2"]) == 1
    rows = log_rows(out)
    assert [r["status"] for r in rows] == ["timeout"] * 3
    assert "exceeded --timeout 0.2 s" in rows[0]["detail"]
    assert main(argv + MAXOFK + ["--timeout", str(RUN)]) == 0     # a resume retries them; in time now
    assert stable(execution.read_log(out / "cells.jsonl").values()) == cells_of(local_maxofk, (0,))
    assert len(log_rows(out)) == 6


def test_checker_failures_keep_their_class(tmp_path):
    """check_outcome words every end of a check as tcert-check does, with its class."""
    from tcert.checker.modelfile import load_model
    model = load_model(str(CERTIFICATES / "models" / "maxof4_seed123.safetensors"))
    cert = json.loads((CERTIFICATES / "accuracy" / "maxof4_seed123_subcubic_svd.json").read_text())
    assert execution.check_outcome(cert, model, "flint")["checked"] == "VERIFIED"
    worse = json.loads(json.dumps(cert))
    worse["claim"]["correct_at_least"] += 1
    got = execution.check_outcome(worse, model, "flint")["checked"]
    assert got.startswith("REJECTED: ") and execution.verdict_class(got) == "REJECTED"
    got = execution.check_outcome(dict(cert, format="not-a-certificate"), model, "flint")["checked"]
    assert got.startswith("ERROR: ") and execution.verdict_class(got) == "ERROR"
    assert execution.classify(ZeroDivisionError("x")) == ("INTERNAL ERROR", "ZeroDivisionError: x")
    assert execution.verdict_class(None) is None and execution.verdict_class("timeout") == "timeout"


def test_log_survives_a_torn_last_line_and_json_is_strict(tmp_path):
    log = tmp_path / "cells.jsonl"
    log.write_text('{"id": "a", "status": "done"}\n{"id": "b", "status": "worker lost"}\n{"id": "c", "sta')
    rows = execution.read_log(log)
    assert sorted(rows) == ["a", "b"] and log.read_text().endswith("\n")
    assert execution.finished(rows["a"]) and not execution.finished(rows["b"])
    assert not execution.finished({"status": "REJECTED"}, retry_failed=True)
    assert execution.dumps({"x": float("nan"), "y": [float("inf"), 1.5]}) == '{"x": null, "y": [null, 1.5]}'
