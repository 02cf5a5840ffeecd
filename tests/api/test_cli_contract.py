"""The `tcert` command-line contract: --version; defaults and exit codes in every --help; --json on every
command with one shape (usage errors included); exit 4 for "inconclusive, no certificate"; --timeout; no
traceback on the ordinary mistakes (a missing output folder, a closed pipe, a missing package); no silent
surprises (lp on any:N, a vacuous accuracy bound)."""

import json
import subprocess
import sys

import pytest

import tcert.api as tc
from tcert.generator.cli import EXIT_CODES, build_parser, main, parser_tree
from tcert.generator.model.files import in_memory_model
from tcert.generator.selftest import maxofk_tensors
from tcert.testing import CERTIFICATES

SHAPE = {"command", "verdict", "out", "figures", "message"}
OVERWHELM = CERTIFICATES / "overwhelm"


def tcert(*argv, stdin=None, timeout=120):
    """Run the installed console script's code in a fresh interpreter: (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-c", "from tcert.generator.cli import run; run()", *argv],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def json_run(capsys, *argv):
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    obj = json.loads(out)
    assert set(obj) == SHAPE and out.count("\n") == 1
    return code, obj


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.safetensors"
    tc.save_model(tc.random_model("preln", seed=4, d_vocab=12, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=6), path)
    return str(path)


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("tcert 0.")
    leaves = 0
    for p in parser_tree(build_parser()):
        text = p.format_help()
        assert "exit codes:" in text and "4  inconclusive" in text and "3  internal error" in text, p.prog
        if not any(a.__class__.__name__ == "_SubParsersAction" for a in p._actions):
            leaves += 1
            assert "--json" in text and "--quiet" in text and "--timeout" in text, p.prog
            for a in p._actions:   # every option with a default shows it in the help text
                if a.option_strings and a.default not in (None, False, "==SUPPRESS==") and a.help != "==SUPPRESS==" \
                        and not isinstance(a.default, bool):
                    assert f"{a.option_strings[-1]}" in text and f"(default:{a.default})".replace(" ", "") in "".join(text.split()), \
                        (p.prog, a.dest)
    assert leaves >= 12
    assert "\n  4  inconclusive" in EXIT_CODES


def test_json_shape_for_written_inconclusive_and_errors(capsys, model_file, tmp_path):
    code, obj = json_run(capsys, "predict", "--model", model_file, "--tokens", "1,2,3", "--out", str(tmp_path / "p.json"))
    assert code == 0 and obj["verdict"] == "written" and obj["out"] == str(tmp_path / "p.json")
    assert obj["command"] == "predict" and obj["figures"]["predicted"] >= 0
    code, obj = json_run(capsys, "model", "inspect", model_file)
    assert code == 0 and obj["command"] == "model inspect" and obj["figures"]["params_total"] > 0
    code, obj = json_run(capsys, "model", "random", "--arch", "attn-only", "--out", str(tmp_path / "r.safetensors"))
    assert code == 0 and obj["verdict"] == "written" and len(obj["figures"]["sha256"]) == 64
    code, obj = json_run(capsys, "predict", "--model", model_file, "--tokens", "1,99", "--out", str(tmp_path / "q.json"))
    assert code == 2 and obj["verdict"] == "error" and "tokens: need 1..6 ids" in obj["message"]
    code, obj = json_run(capsys, "predict", "--model", model_file)          # a usage error is still one object
    assert code == 2 and obj["verdict"] == "error" and "required" in obj["message"] and obj["command"] == "predict"
    code, obj = json_run(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in obj["message"]
    claim = json.loads((OVERWHELM / "perm_lp.json").read_text())["claim"]
    code, obj = json_run(capsys, "overwhelm", "--model", str(OVERWHELM / "neox1l_tiny.safetensors"), "--prefix-ids",
                         ",".join(map(str, claim["prefix"])), "--query-id", str(claim["query"]), "--free",
                         "perm:" + ",".join(map(str, claim["free"]["tokens"])), "--method", "naive",
                         "--out", str(tmp_path / "o.json"))
    assert code == 4 and obj["verdict"] == "inconclusive" and obj["out"] is None
    assert obj["figures"]["verdict"] == "Inconclusive" and not (tmp_path / "o.json").exists()


def test_lp_on_any_is_refused_not_silently_naive(capsys, tmp_path):
    claim = json.loads((OVERWHELM / "perm_lp.json").read_text())["claim"]
    argv = ["overwhelm", "--model", str(OVERWHELM / "neox1l_tiny.safetensors"), "--prefix-ids",
            ",".join(map(str, claim["prefix"])), "--query-id", str(claim["query"]), "--free", "any:1",
            "--out", str(tmp_path / "o.json")]
    assert main(argv) == 2 and "permutation set" in capsys.readouterr().err   # --method lp is the default
    upto = [a if a != "any:1" else "upto:1" for a in argv]
    assert main(upto) == 2 and "permutation set" in capsys.readouterr().err
    assert main(argv + ["--method", "naive"]) in (0, 4)


def test_vacuous_accuracy_needs_force(capsys, tmp_path):
    t, c = maxofk_tensors(5, 3, 0.01, 0)
    t["unembed.W_U"] = -t["unembed.W_U"]    # never correct: the certified count is 0
    path = str(tmp_path / "never.safetensors")
    tc.save_model(in_memory_model(t, c), path)
    out = tmp_path / "a.json"
    assert main(["accuracy", "--model", path, "--out", str(out)]) == 4 and not out.exists()
    assert "vacuous" in capsys.readouterr().out
    assert main(["accuracy", "--model", path, "--out", str(out), "--force"]) == 0 and out.exists()
    assert "VACUOUS" in capsys.readouterr().out


def test_no_traceback_on_ordinary_mistakes(model_file, tmp_path):
    code, out, err = tcert("predict", "--model", model_file, "--tokens", "1,2", "--out", str(tmp_path / "no" / "p.json"))
    assert code == 2 and err.strip().count("\n") == 0 and "does not exist" in err and "Traceback" not in err
    code, out, err = tcert("model", "random", "--arch", "preln", "--out", str(tmp_path / "missing" / "m.safetensors"))
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    # a closed pipe: `tcert model inspect M | head -1`
    p = subprocess.run(f"{sys.executable} -c 'from tcert.generator.cli import run; run()' model inspect {model_file}"
                       " | head -1", shell=True, capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("model") and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_closed_pipe_on_a_long_output(model_file):
    """Many lines into `head -1` (the pipe closes while tcert still writes)."""
    p = subprocess.run(f"{sys.executable} -c 'from tcert.generator.cli import run; run()' --help | head -1",
                       shell=True, capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("usage") and "Traceback" not in p.stderr


def test_a_missing_generator_dependency_is_one_line():
    """A generator dependency missing (as in a checker-only install): numpy blocked before tcert starts."""
    code = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'numpy':\n            raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
            "sys.meta_path.insert(0, Block())\nsys.argv = ['tcert', 'model', 'inspect', 'x']\n"
            "from tcert.generator.cli import run\nrun()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == ("ERROR: tcert needs the Python package 'numpy': install the full generator install: "
                                "pip install tcert (the checker-only install has tcert-check alone)")


def test_timeout_ends_in_exit_5_with_nothing_written(tmp_path):
    code, out, err = tcert("selftest", "--examples", "50", "--timeout", "2", "--json")
    obj = json.loads(out)
    assert code == 5 and obj["verdict"] == "timeout" and "--timeout 2 s" in obj["message"]


def test_progress_stays_off_when_stderr_is_not_a_terminal(model_file, tmp_path):
    code, out, err = tcert("influence", "--model", model_file, "--out", str(tmp_path / "i.json"))
    assert code == 0 and err == "" and "wrote" in out


class Terminal:
    """A stand-in for a terminal's stderr: isatty() is True, writes are kept."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_line_on_a_terminal_and_quiet_turns_it_off(monkeypatch):
    import argparse
    import time
    from tcert.generator import cli
    term = Terminal()
    monkeypatch.setattr(cli.sys, "stderr", term)
    args = argparse.Namespace(quiet=False, func=None)
    with cli._progress("predict", args):
        time.sleep(1.3)
    assert "tcert predict: working, 1 s" in term.text and term.text.endswith("\r\033[K")
    term.text = ""
    with cli._progress("predict", argparse.Namespace(quiet=True, func=None)):
        time.sleep(1.3)
    assert term.text == ""


def test_selftest_draws_a_progress_bar_on_a_terminal():
    import os
    import pty
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a real terminal has a size
    p = subprocess.run([sys.executable, "-c", "from tcert.generator.cli import run; run()", "selftest",
                        "--examples", "1", "--kinds", "prediction"], stdout=subprocess.PIPE, stderr=slave,
                       text=True, timeout=120)
    import select
    seen = ""
    while select.select([master], [], [], 0.5)[0]:   # read while the slave end is open (Linux drops it after)
        seen += os.read(master, 65536).decode(errors="replace")
    os.close(slave)
    os.close(master)
    assert p.returncode == 0 and "example" in seen and "selftest passed" in p.stdout
