"""tcert-check's command-line contract: --version, --json fields (model SHA-256, versions, backend,
precision, statement, figures), usage errors as one JSON object, help with defaults and exit codes,
--timeout, progress on a terminal only, the precision hint after a REJECTED, and a missing python-flint."""

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tcert.checker import cli
from tcert.checker.verify import verify
from tcert.generator.certificate import dumps, format_number
from tcert.testing import CERTIFICATES, ROOT

PERM_LP, NEOX = CERTIFICATES / "overwhelm" / "perm_lp.json", CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"
SLOW = (CERTIFICATES / "influence" / "maxof4_seed123.influence.json",
        CERTIFICATES / "influence" / "maxof4_seed123.safetensors")   # ~10 s CPU with mpmath, ~900 obligations
LIBRARIES = ("tcert", "python", "numpy", "mpmath", "python-flint")


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    assert out.err == "" and len(out.out.splitlines()) == 1, out
    return code, out.out.strip()


def test_version(capsys):
    code, line = run(capsys, "--version")
    assert code == 0 and line.startswith("tcert-check 0.1.0 (python ")
    for name in LIBRARIES[1:]:
        assert f"{name} " in line
    code, line = run(capsys, "--version", "--json")
    assert code == 0 and set(json.loads(line)["versions"]) == set(LIBRARIES)


@pytest.mark.parametrize("name", ["flint", "flint-exact", "mpmath", "mpmath+exact"])
def test_every_backend_name_is_offered_and_verifies(capsys, name):
    """--backend takes each backend with the exact product layer on and off; the shipped certificate verifies
    under all four, and the JSON record names the one used."""
    code, line = run(capsys, PERM_LP, "--model", NEOX, "--json", "--backend", name)
    r = json.loads(line)
    assert code == 0 and r["verdict"] == "VERIFIED" and r["backend"] == name


def test_json_verified_carries_what_an_auditor_files(capsys):
    code, line = run(capsys, PERM_LP, "--model", NEOX, "--json", "--backend", "mpmath", "--prec", "80")
    r = json.loads(line)
    assert code == 0 and r["verdict"] == "VERIFIED" and r["kind"] == "overwhelm"
    assert r["model_sha256"] == json.loads(PERM_LP.read_text())["model_sha256"]
    assert (r["backend"], r["prec"]) == ("mpmath", 80) and set(r["versions"]) == set(LIBRARIES)
    assert r["statement"] == json.loads(PERM_LP.read_text())["statement"]
    names = [o["name"] for o in r["obligations"]]
    assert names[0].startswith("overwhelm lp: ") and names[-1] == "statement: the claim in words"
    margin = next(o["figures"]["evidence.sample.margin"] for o in r["obligations"]
                  if "evidence.sample.margin" in o["figures"])
    assert "/" in margin and int(margin.split("/")[0]) > 0        # exact, as p/q


def test_json_rejected_and_error(capsys, tmp_path):
    other = CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors"
    code, line = run(capsys, PERM_LP, "--model", other, "--json")
    r = json.loads(line)
    assert code == 1 and r["verdict"] == "REJECTED" and r["obligation"] == "model binding"
    assert r["model_sha256"] != json.loads(PERM_LP.read_text())["model_sha256"] and r["kind"] == "overwhelm"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, line = run(capsys, bad, "--model", NEOX, "--json")
    r = json.loads(line)
    assert code == 2 and r["verdict"] == "ERROR" and "not valid JSON" in r["error"] and "versions" in r


@pytest.mark.parametrize("argv", [[], ["c.json"], ["--model", "m"], ["c.json", "--model", "m", "--backend", "x"],
                                  ["c.json", "--model", "m", "--prec", "7"], ["c.json", "--model", "m", "--bogus"],
                                  ["c.json", "--model", "m", "--prec", "sixty"], ["c.json", "--model", "m", "--timeout", "0"],
                                  ["c.json", "--model", "m", "--report", "r.pdf"],
                                  ["c.json", "--model", "m", "--report", "/nonexistent/r.html"]])
def test_usage_errors_are_one_line_or_one_json_object(capsys, argv):
    code, line = run(capsys, *argv)
    assert code == 2 and line.startswith("usage error: ") and "tcert-check --help" in line
    code, line = run(capsys, *argv, "--json")
    assert code == 2 and json.loads(line)["verdict"] == "ERROR"


def test_help_gives_defaults_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0
    for option in ("--backend", "--prec", "--retry-prec", "--json", "--report", "--timeout", "--quiet"):
        block = text.split("options:", 1)[1].split("\n  " + option, 1)[1].split("\n  -", 1)[0]
        assert "default" in block, option
    for code, word in ((0, "VERIFIED"), (1, "REJECTED"), (2, "ERROR"), (3, "INTERNAL ERROR")):
        assert f"  {code}  {word}" in text
    assert "never exits 4 or 5" in text and "exits 4 when a run is inconclusive" in text


def test_timeout(capsys):
    start = time.perf_counter()
    code, line = run(capsys, SLOW[0], "--model", SLOW[1], "--backend", "mpmath", "--timeout", "0.5", "--json")
    r = json.loads(line)
    assert code == 2 and r["verdict"] == "ERROR" and "did not finish within --timeout 0.5 s" in r["error"]
    assert time.perf_counter() - start < 30
    assert r["kind"] == "influence" and r["model_sha256"]


def test_a_swallowed_timeout_interrupt_is_still_the_timeout():
    """A library that swallows the clock's KeyboardInterrupt (mpmath wraps conversions in a bare `except:`)
    neither outlives the deadline by long (the interrupt is repeated) nor gets a verdict reported: a block
    that ends after expiry ends as the timeout. SIGINT gets Python's default handler here, as in a tcert-check
    process: earlier tests in the same pytest process (Dask) may leave it ignored, and interrupt_main does
    nothing for an ignored signal."""
    import signal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_swallowed_timeouts()
    finally:
        signal.signal(signal.SIGINT, previous)


def run_swallowed_timeouts():
    """The body of the test above (SIGINT handled by Python)."""
    from tcert.audit.terminal import Deadline
    from tcert.checker.errors import BadInput
    start = time.perf_counter()
    with pytest.raises(BadInput, match="did not finish within --timeout"):
        with Deadline(0.05):
            for _ in range(20):     # swallows every interrupt for 0.2 s, then returns normally
                try:
                    time.sleep(0.01)
                except BaseException:
                    pass
    with pytest.raises(BadInput, match="did not finish within --timeout"):
        with Deadline(0.05):
            for _ in range(25):     # swallows the first interrupt only: the repeated one ends it
                try:
                    time.sleep(0.2)
                except BaseException:
                    break
            busy = time.perf_counter() + 5
            while time.perf_counter() < busy:   # Python bytecode: where a (simulated) SIGINT is delivered
                pass
    assert time.perf_counter() - start < 4.5      # the busy loop alone would run 5 s
    with Deadline(5) as d:          # a block that ends in time is untouched
        pass
    assert not d.expired


def test_progress_on_a_terminal_only(tmp_path):
    """On a terminal stderr shows the running obligation once a check passes PROGRESS_AFTER seconds; --quiet
    and a non-terminal stderr (every other test) show nothing."""
    def stderr_of(*extra, seconds=90):
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "tcert.checker.cli", str(SLOW[0]), "--model", str(SLOW[1]),
                                 "--backend", "mpmath", *extra], stdout=subprocess.DEVNULL, stderr=slave, cwd=ROOT)
        os.close(slave)
        seen, deadline = b"", time.monotonic() + seconds
        try:
            while time.monotonic() < deadline and b"obligation(s) held; checking: influence" not in seen:
                if select.select([master], [], [], 0.5)[0]:
                    try:
                        seen += os.read(master, 4096)
                    except OSError:
                        break
                if proc.poll() is not None and not select.select([master], [], [], 0.1)[0]:
                    break
        finally:
            proc.kill()
            proc.wait()
            os.close(master)
        return seen.decode(errors="replace")
    assert "obligation(s) held; checking: influence: constant" in stderr_of()
    assert "tcert-check:" not in stderr_of("--quiet", seconds=8)


def tight_overwhelm(tmp_path):
    """perm_lp.json with its deviation W claimed at the bound certified at 256 bits: below the 64-bit bound.
    (A prediction claim no longer serves: the prediction kind raises its own precision before REJECTED.)"""
    cert = json.loads(PERM_LP.read_text())
    model = CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"
    ob = verify(cert, model, "flint", 256)
    cert["evidence"]["deviation"] = format_number(ob.figure("evidence.deviation"))
    del cert["statement"]
    path = tmp_path / "tight.json"
    path.write_text(dumps(cert))
    return path, model


def test_a_rejection_more_precision_turns_around_says_so(capsys, tmp_path):
    path, model = tight_overwhelm(tmp_path)
    code, line = run(capsys, path, "--model", model)
    assert code == 1 and line.startswith("REJECTED: overwhelm lp: deviation bound: ")
    assert line.endswith("[at --prec 64; VERIFIED at --prec 256: re-run with --prec 256]")
    code, line = run(capsys, path, "--model", model, "--prec", "256")
    assert code == 0
    code, line = run(capsys, path, "--model", model, "--retry-prec", "0")
    assert code == 1 and "--prec" not in line
    code, line = run(capsys, path, "--model", model, "--retry-prec", "70", "--json")
    r = json.loads(line)
    assert code == 1 and r["prec_hint"] == {"prec": 70, "verdict": "REJECTED", "obligation": "overwhelm lp: deviation bound"}
    assert r["detail"].endswith("[also REJECTED at --prec 70]")


def test_model_binding_is_not_retried(capsys):
    code, line = run(capsys, PERM_LP, "--model", CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors", "--json")
    assert code == 1 and "prec_hint" not in json.loads(line)


def test_missing_python_flint_is_exit_2_with_a_hint(tmp_path):
    """Without python-flint (import blocked) the default backend is unusable input with a one-line hint, never
    an internal error; --backend mpmath still checks."""
    main = ("import sys; sys.modules['flint'] = None\nfrom tcert.checker.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    base = [sys.executable, "-c", main, str(PERM_LP), "--model", str(NEOX)]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == ""
    assert proc.stdout.strip() == ("ERROR: backend flint needs the package python-flint, which is not installed: "
                                   "pip install python-flint, or use --backend mpmath")
    proc = subprocess.run(base + ["--backend", "mpmath"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("VERIFIED: overwhelm")
    proc = subprocess.run(base + ["--version"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and "python-flint not installed" in proc.stdout


def test_allocator_setting_is_speed_only(capsys, monkeypatch):
    """keep_freed_memory (the heap keeps freed numpy temporaries' pages) takes on glibc and is a no-op without
    it; a check gives the same verdict and the same exact figures with and without it."""
    from tcert.audit import terminal
    assert terminal.keep_freed_memory() is bool(os.confstr("CS_GNU_LIBC_VERSION"))
    records = []
    for setting in (terminal.keep_freed_memory, lambda: False):
        monkeypatch.setattr(cli, "keep_freed_memory", setting)
        code, line = run(capsys, PERM_LP, "--model", NEOX, "--json")
        r = json.loads(line)
        steps = [{k: v for k, v in o.items() if k != "seconds"} for o in r.pop("obligations")]
        records.append((code, steps, {k: v for k, v in r.items() if k != "seconds"}))
    assert records[0] == records[1] and records[0][0] == 0
    monkeypatch.setattr(os, "confstr", lambda name: None)      # no glibc (musl, macOS): nothing is set
    assert terminal.keep_freed_memory() is False
