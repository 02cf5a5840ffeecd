"""Regression tests for the hostile inputs that once ended in exit 3, a hang or unbounded memory.

Each case is built the way it was found (an attacker's construction, or an honest certificate from our
own generator on an extreme model) and run through the real `tcert-check` in a child process with both
backends: every run must end in exit 0, 1 or 2 with exactly one line and nothing on stderr, both backends
must give the same verdict, and the child must stay within a time and memory cap (its own peak RSS,
VmHWM). The findings:
1. big rationals through mpmath's decimal conversion (exit 3): LP duals with pairwise-coprime 370-digit
   denominators; tight certificates on sharp attention (W_Q x 1e3; attn_scale 1/10000);
2. a hang: tight on attn_scale 1/100 with W_Q x 1e3 (8e7-bit Fractions summed);
3. a rejection message that overflowed (an LP dual of 0x1p+4096): exit 1, not 3;
4. d_vocab = 1 for every kind;
5. quadratic time and memory from a 2 KB model declaring n_ctx = 2^22 (the resource model refuses);
6. JSON memory of `[{},{},...]` files (the reader bounds it before parsing).
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker import envelope
from tcert.checker.modelfile import load_model
from tcert.generator import certificate
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model
from tcert.testing import CERTIFICATES
from tcert.testing.overwhelm import tiny_neox1l

PERM_LP = CERTIFICATES / "overwhelm" / "perm_lp.json"
NEOX_TINY = CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"
TIME_CAP = 20.0           # seconds per backend (the hang ran > 100 s; honest cases here take < 1 s)
RSS_CAP = 600 << 20       # bytes of peak RSS for a child that checks a small case (about 90 MiB here)

CHILD = r"""
import contextlib, io, json, signal, sys, time
from tcert.checker import cli
args, backends, cap = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
signal.alarm(cap)   # a hang kills the child (exit by SIGALRM), which fails the test
runs = []
for b in backends:
    out, start = io.StringIO(), time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli.main(args + ["--backend", b])
    runs.append([code, out.getvalue(), time.perf_counter() - start])
sys.stdout.write(json.dumps(runs))
"""
# The child's own peak RSS: VmHWM of /proc/self/status (kB), written at exit to a pipe of its own
# (ru_maxrss from wait4 would also count the pages the child shared with this process after fork).
HWM = r"""
import atexit, os
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            os.write(int(os.environ["TCERT_HWM_FD"]), line.split()[1].encode())
atexit.register(_hwm)
"""


def run_child(script: str, *args, timeout: float = 120) -> tuple:
    """(exit code, stdout, stderr, peak RSS in bytes) of `python -c script args` in a child process; the
    RSS is the child's own high-water mark (VmHWM), reported through a pipe."""
    read, write = os.pipe()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, "-c", HWM + script, *args], stdout=out, stderr=err,
                                 pass_fds=(write,), env=dict(os.environ, TCERT_HWM_FD=str(write)))
        os.close(write)
        code = child.wait(timeout)
        with os.fdopen(read, "rb") as hwm:
            rss = int(hwm.read() or 0) * 1024
        out.seek(0), err.seek(0)
        return code, out.read().decode(), err.read().decode(), rss


def check(cert, model, *extra, backends=("flint", "mpmath")):
    """tcert-check on (cert, model) with each backend in one child process: (list of (exit, line, seconds),
    peak RSS bytes of the child). Asserts one line per run, an empty stderr and a proper exit code."""
    args = [str(cert), "--model", str(model), *extra]
    cap = int(TIME_CAP * len(backends)) + 10
    code, out, err, rss = run_child(CHILD, json.dumps(args), json.dumps(list(backends)), str(cap), timeout=cap + 20)
    assert code == 0 and err == "", (code, err[-2000:])
    runs = json.loads(out)
    for code, text, seconds in runs:
        assert code in (0, 1, 2) and len(text.splitlines()) == 1, (code, text[-2000:])
        assert seconds < TIME_CAP, f"{seconds:.1f} s: {text}"
    return runs, rss


def same_verdict(runs) -> int:
    """The common exit code of all backends' runs (asserting they agree, and on the verdict word)."""
    codes = {code for code, _, _ in runs}
    words = {text.split(":")[0] for _, text, _ in runs}
    assert len(codes) == 1 and len(words) == 1, runs
    return codes.pop()


def write(tmp_path, name, cert) -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(certificate.dumps(cert) if isinstance(cert, dict) else cert)
    return path


def model_file(tmp_path, name, tensors_cfg):
    path = str(tmp_path / f"{name}.safetensors")
    save_model(path, *tensors_cfg)
    return path, load_model(path)


# --- 1. big rationals --------------------------------------------------------------------------------

def coprime_denominators(count: int, digits: int) -> list:
    """`count` pairwise-coprime integers of about `digits` digits: N i + 1 with N divisible by every
    prime below `count` (a common divisor of N i + 1 and N j + 1 divides i - j and is prime to N)."""
    n = 10 ** (digits - 4) * math.lcm(*range(1, count + 1))
    return [n * i + 1 for i in range(1, count + 1)]


def test_lp_duals_with_coprime_370_digit_denominators(tmp_path):
    """Every LP dual of the shipped perm certificate replaced by the nearest ratio with its own 370-digit
    denominator (pairwise coprime: the exact sum of a head's duals has over 4,300 digits). mpmath once
    answered exit 3 (decimal string limit) where Arb answered exit 1."""
    cert = json.loads(PERM_LP.read_text())
    slots = [(side, part, i) for head in cert["evidence"]["lp_duals"] for side in head.values()
             for part in ("u", "v") for i in range(len(side[part]))]
    for (side, part, i), q in zip(slots, coprime_denominators(len(slots), 370)):
        x = Fraction(float.fromhex(side[part][i]))
        side[part][i] = f"{round(x * q)}/{q}"
    assert max(len(s[0][s[1]][s[2]]) for s in slots) > 370
    runs, rss = check(write(tmp_path, "c.json", cert), NEOX_TINY)
    assert same_verdict(runs) in (0, 1)
    assert rss < RSS_CAP


def sharp_tight(tmp_path, seed, qk_scale, wq_factor, attn_scale=None):
    """An honest tight certificate from our generator (force=True) on a tiny neox1l with W_Q scaled."""
    from tcert.generator.overwhelm.tight import generate_tight
    tensors, cfg = tiny_neox1l(seed, qk_scale=qk_scale, attn_scale=attn_scale)
    tensors["blocks.0.attn.W_Q"] = tensors["blocks.0.attn.W_Q"] * np.float32(wq_factor)
    path, model = model_file(tmp_path, f"sharp{seed}", (tensors, cfg))
    cert, report = generate_tight(model, [1] * 20, 2, ("perm", 3, [0, 3, 4]), force=True)
    text = certificate.dumps(cert)
    assert "NaN" not in text and "Infinity" not in text   # the generator once wrote NaN here
    return write(tmp_path, f"sharp{seed}.json", text), path, report


@pytest.mark.parametrize("seed", [0, 2])
def test_tight_on_sharp_attention_w_q_times_1000(tmp_path, seed):
    """W_Q x 1e3: exp enclosures of scores far below the query's once became Fractions of 14,000+ bits fed
    to B.num (mpmath: exit 3; Arb: VERIFIED, true). Now both verify the generator's certificate."""
    cert, model, report = sharp_tight(tmp_path, seed, 1.0, 1e3)
    runs, rss = check(cert, model)
    assert same_verdict(runs) == (0 if report["verdict"] == "Overwhelmed" else 1)
    assert rss < RSS_CAP


def test_attn_scale_one_ten_thousandth(tmp_path):
    """A random neox1l with attn_scale 1/10000 (scores multiplied by 10^4): prediction and tight."""
    from tcert.generator.overwhelm.tight import generate_tight
    from tcert.generator.prediction import prediction_certificate
    path, model = model_file(tmp_path, "scale", random_model("neox1l", seed=5, attn_scale="1/10000"))
    pred = write(tmp_path, "p.json", prediction_certificate(model, [1, 2, 3, 4, 5])[0])
    tight = write(tmp_path, "t.json", generate_tight(model, [1] * 5, 2, ("perm", 2, [0, 3]), force=True)[0])
    for cert in (pred, tight):
        runs, rss = check(cert, path)
        assert same_verdict(runs) in (0, 1)
        assert rss < RSS_CAP


# --- 2. the hang -------------------------------------------------------------------------------------

def test_tight_attn_scale_one_hundredth_w_q_times_1000_does_not_hang(tmp_path):
    """attn_scale 1/100 and W_Q x 1e3: scores near -5e7 once gave 8e7-bit Fractions summed in beta_bounds
    (no answer after 100 s with Arb; mpmath exit 3 after 24 s). Now both verify in well under a second."""
    cert, model, report = sharp_tight(tmp_path, 3, 0.5, 1e3, attn_scale="1/100")
    runs, rss = check(cert, model)
    assert same_verdict(runs) == (0 if report["verdict"] == "Overwhelmed" else 1)
    assert max(seconds for _, _, seconds in runs) < 5.0
    assert rss < RSS_CAP


# --- 3. the rejection message that overflowed ------------------------------------------------------

@pytest.mark.parametrize("value", ["0x1p+4096", "-0x1p+4096"])
def test_lp_dual_two_to_the_4096_is_rejected(tmp_path, value):
    """One LP dual set to +-2^4096: the dual-feasibility (or objective) message once formatted float(s):
    OverflowError, exit 3 on both backends. Now REJECTED, exit 1, naming the obligation."""
    cert = json.loads(PERM_LP.read_text())
    cert["evidence"]["lp_duals"][0]["max"]["u"][0] = value
    runs, _ = check(write(tmp_path, "c.json", cert), NEOX_TINY)
    assert same_verdict(runs) == 1
    assert all(text.startswith("REJECTED: overwhelm lp:") for _, text, _ in runs), runs


# --- 4. d_vocab = 1 ----------------------------------------------------------------------------------

def one_token(tensors_cfg):
    """The model with its vocabulary cut to token 0 (W_E's first row, W_U's first column)."""
    tensors, cfg = tensors_cfg
    t = dict(tensors)
    t["embed.W_E"] = t["embed.W_E"][:1]
    t["unembed.W_U"] = t["unembed.W_U"][:, :1]
    if "unembed.b_U" in t:
        t["unembed.b_U"] = t["unembed.b_U"][:1]
    return t, dict(cfg, d_vocab=1)


def kinds_models_certificates(tmp_path):
    """kind -> (model (tensors, cfg) of its family, a valid certificate for it)."""
    from tcert.generator.accuracy.strategies import make_certificate
    from tcert.generator.influence import influence_certificate, toy_model
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.prediction import prediction_certificate
    from tcert.testing.accuracy import constructed
    out = {}
    for kind, tc in {"prediction": random_model("preln", d_vocab=4, n_ctx=8, seed=1),
                     "overwhelm": tiny_neox1l(6),
                     "accuracy": constructed(6, 3, 15.0, 3.0, 0.1, 1),
                     "influence": toy_model(n_layers=2, d_vocab=3, n_ctx=5)}.items():
        _, model = model_file(tmp_path, kind, tc)
        cert = {"prediction": lambda: prediction_certificate(model, [1, 2, 0])[0],
                "overwhelm": lambda: generate(model, [1] * 6, 2, ("perm", 2, [0, 3]), "lp", "table", force=True)[0],
                "accuracy": lambda: make_certificate(model, "cubic")[0],
                "influence": lambda: influence_certificate(model)}[kind]()
        out[kind] = (tc, cert)
    return out


def test_d_vocab_one_every_kind(tmp_path):
    """A certificate of each kind bound to the same model cut to one token (d_vocab = 1): prediction once
    took min() of an empty sequence, overwhelm tight's summary show(None): exit 3. Now each kind ends
    with a proper verdict (refusal: exit 2), the same on both backends."""
    for kind, (tc, cert) in kinds_models_certificates(tmp_path).items():
        path, model = model_file(tmp_path, f"{kind}1", one_token(tc))
        cert = dict(cert, model_sha256=model.sha256)
        runs, rss = check(write(tmp_path, f"{kind}1.json", cert), path)
        # influence: one token cannot be changed, so any bound holds (VERIFIED is true); the others refuse
        assert same_verdict(runs) in ((0, 1, 2) if kind == "influence" else (1, 2)), (kind, runs)
        assert rss < RSS_CAP


# --- 5. quadratic work from a tiny model --------------------------------------------------------------

@pytest.fixture(scope="module")
def nope_2k(tmp_path_factory):
    """A tiny (4.6 KB) two-layer NoPE model declaring n_ctx = 2^22, and an honest 100-token prediction for it."""
    from tcert.generator.prediction import prediction_certificate
    d = tmp_path_factory.mktemp("nope")
    path = str(d / "nope.safetensors")
    save_model(path, *random_model("preln", d_vocab=4, d_model=4, n_heads=1, d_head=4, d_mlp=4, n_ctx=1 << 22,
                                   n_layers=2, seed=0, positional_embedding_type="none"))
    assert os.path.getsize(path) < 5 << 10   # a few KB: 2 KB of weights and header, plus the config
    model = load_model(path)
    tokens = np.random.default_rng(0).integers(0, 4, 100).tolist()
    return d, path, prediction_certificate(model, tokens)[0]


def with_tokens(cert, n):
    return dict(cert, claim=dict(cert["claim"], tokens=[t % 4 for t in range(n)]))


def test_nope_2kb_model_100k_tokens_refused_before_work(nope_2k):
    """100,000 tokens on the 2 KB model (a 300 KB certificate): once hours and terabytes; now exit 2 at
    once, naming the estimate and the option, in a small process."""
    d, model, cert = nope_2k
    runs, rss = check(write(d, "n100k.json", with_tokens(cert, 100_000)), model)
    assert same_verdict(runs) == 2
    for _, text, seconds in runs:
        assert text.startswith("ERROR: resource limit: checking this prediction (2 layer(s), 100000 tokens)")
        assert "--max-work" in text and "--max-memory" in text and seconds < 2.0
    assert rss < RSS_CAP


def test_nope_2kb_model_limits_are_options(nope_2k):
    """N = 3,200 (once 22 s and 2 GB) is refused under --max-memory 1 (GiB), the honest 100-token
    certificate (mpmath: 5 s) verifies with both backends under the defaults, within its memory estimate."""
    from tcert.checker.kinds import cost_for
    d, model, cert = nope_2k
    runs, _ = check(write(d, "n3200.json", with_tokens(cert, 3200)), model, "--max-memory", "1",
                    backends=("flint",))
    assert runs[0][0] == 2 and "GiB of memory (limits: " in runs[0][1], runs
    runs, rss = check(write(d, "n100.json", cert), model)
    assert same_verdict(runs) == 0
    estimate = cost_for("prediction")(load_model(model).config, cert["claim"], cert["evidence"])
    assert rss < RSS_CAP + estimate.memory


# --- 6. JSON memory ------------------------------------------------------------------------------------

READER = r"""
import sys
from tcert.checker import envelope
from tcert.checker.errors import BadInput
try:
    envelope.load_certificate(sys.argv[1])
except BadInput as e:
    print(e)
"""


@pytest.mark.parametrize("mib", [32, 96, 256])
def test_json_of_empty_objects_bounded_memory(tmp_path, mib):
    """`[{},{},...]` of 32/96/256 MiB once cost 27 bytes of RSS per input byte (256 MiB: about 7 GB).
    The reader estimates its memory first (envelope.parse_memory) and refuses above its limit (2 GiB by
    default): 32 MiB is parsed within its estimate and refused as not an object; 96 and 256 MiB are refused
    before parsing, holding little more than their bytes."""
    path = tmp_path / "list.json"
    n = (mib << 20) // 3
    with open(path, "wb") as f:   # written 1 MiB at a time: this process stays small
        f.write(b"[")
        for start in range(0, n - 1, 1 << 18):
            f.write(b"{}," * min(1 << 18, n - 1 - start))
        f.write(b"{}]")
    data_size = os.path.getsize(path)
    assert data_size == 3 * n + 1
    estimate = envelope.parse_memory(path.read_bytes()) if mib == 32 else None
    start = time.perf_counter()
    code, out, err, rss = run_child(READER, str(path))
    seconds = time.perf_counter() - start
    assert code == 0 and err == "" and len(out.splitlines()) == 1, (out, err)
    if mib == 32:
        assert out.startswith("certificate: ") and "limit" not in out, out
        assert rss < estimate + (100 << 20)
    else:
        assert "would need about" in out and "above the reader's limit" in out, out
        assert rss < data_size + (40 << 20)
    assert seconds < 60
    path.unlink()


# --- 7. generator side -------------------------------------------------------------------------------

def test_upto_force_never_writes_another_tokens_evidence(tmp_path):
    """upto:3 on a model where length 1 already predicts another token (1, then 3): with force the
    generator once wrote that length's evidence (for token 3) into a certificate claiming token 1. Now
    it writes no certificate; where every length predicts the claimed token, force still writes one."""
    from tcert.generator.overwhelm.upto import generate_upto
    _, model = model_file(tmp_path, "upto3", tiny_neox1l(3, qk_scale=0.5))
    cert, report = generate_upto(model, [1] * 3, 2, 3, "naive", "table", "auto", force=True)
    assert [r["predicted"] for r in report["lengths"]] == [1, 3, 3, 3] and 1 in report["failing"]
    assert cert is None
    _, model = model_file(tmp_path, "upto0", tiny_neox1l(0, qk_scale=0.5))
    cert, report = generate_upto(model, [1] * 3, 2, 3, "naive", "table", "auto", force=True)
    assert len({r["predicted"] for r in report["lengths"]}) == 1 and cert is not None
    assert len(cert["evidence"]["lengths"]) == 4

