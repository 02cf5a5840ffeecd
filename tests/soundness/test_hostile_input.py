"""Hostile input to `tcert-check`: broken certificates and model files made to crash, hang or fool it.

Every case must end with exit 2 and exactly one line of output (no traceback), within a per-input time
limit; the model reader's limits are tested at the limit and one past it. A few cases run the real
CLI in a subprocess to prove that nothing reaches stderr. Byte-level fuzzing of a valid certificate
and model file must give a proper verdict (0/1/2, never 3), and whatever verifies must be true.
"""

import contextlib
import json
import os
import pickle
import struct
import subprocess
import sys
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker import cli, modelfile
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_number
from tcert.checker.modelfile import load_model, parse_config
from tcert.testing import ROOT, example_scale
from tcert.generator import certificate
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.model.files import save_model
from tcert.generator.prediction import prediction_certificate
from tcert.generator.model.random_models import random_model
from tcert.testing import fuzz
from tcert.testing.envelope import ENVELOPE_ERRORS

TIME_LIMIT = 10.0  # seconds per input (generous: the machine is shared; a hang is what it catches)


def fuzz_examples(ci: int) -> int:
    """Examples per fuzz test: the CI size, 10x under the large profile, or TCERT_FUZZ_EXAMPLES
    (the long profile by hand: TCERT_FUZZ_EXAMPLES=20000, roughly 30-60 minutes)."""
    return int(os.environ.get("TCERT_FUZZ_EXAMPLES", example_scale(ci)))


def time_limit(seconds=TIME_LIMIT * 3):
    """Abort a run that hangs (SIGALRM), so that a hang fails the test instead of stalling CI."""
    return fuzz.time_limit(seconds)


def run(capsys, cert_path, model_path, *extra):
    """tcert-check in-process: (exit code, its single output line); asserts one line and the time."""
    start = time.perf_counter()
    with time_limit():
        code = cli.main([str(cert_path), "--model", str(model_path), *extra])
    elapsed = time.perf_counter() - start
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 1 and captured.err == "", captured
    assert elapsed < TIME_LIMIT, f"took {elapsed:.1f} s"
    return code, lines[0]


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """A tiny model file, a valid certificate for it, and their bytes."""
    d = tmp_path_factory.mktemp("valid")
    tensors, config = random_model("neox1l", seed=5)
    model_path = d / "m.safetensors"
    save_model(str(model_path), tensors, config)
    model = load_model(str(model_path))
    cert, _ = prediction_certificate(model, [1, 2, 3, 4, 5])
    cert_path = d / "c.json"
    certificate.write(str(cert_path), cert)
    return {"model": model, "model_path": model_path, "cert_path": cert_path, "cert": cert,
            "config": config, "tensors": tensors, "model_bytes": model_path.read_bytes(),
            "cert_bytes": cert_path.read_bytes()}


# --- safetensors assembly for hostile model files ------------------------------------------------------

def split_model(data: bytes):
    """(header dict, body bytes) of a safetensors file."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_model(header, body: bytes, header_bytes: bytes | None = None) -> bytes:
    """A safetensors file from a header (dict, or raw bytes) and a body."""
    h = header_bytes if header_bytes is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def edit_header(valid, fn):
    """The valid model's bytes after fn(header) edits its header in place (body unchanged)."""
    header, body = split_model(valid["model_bytes"])
    fn(header)
    return join_model(header, body)


def edit_config(valid, **changes):
    """The valid model's bytes with config fields changed (None deletes a field)."""
    def fn(h):
        cfg = json.loads(h["__metadata__"]["config"])
        for k, v in changes.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        h["__metadata__"]["config"] = json.dumps(cfg)
    return edit_header(valid, fn)


def set_weight(valid, name: str, value, dtype=np.float32) -> bytes:
    """The valid model's bytes with the first element of tensor `name` overwritten by `value`."""
    header, body = split_model(valid["model_bytes"])
    lo = header[name]["data_offsets"][0]
    item = np.array([value], dtype=dtype).tobytes()
    body = body[:lo] + item + body[lo + len(item):]
    return join_model(header, body)


def f16_model(valid, value) -> bytes:
    """A float16 copy of the valid model with `value` as the first weight of W_E."""
    from safetensors.numpy import save
    header, _ = split_model(valid["model_bytes"])
    arrays = {k: np.asarray(v, np.float16) for k, v in valid["tensors"].items()}
    arrays["embed.W_E"] = arrays["embed.W_E"].copy()
    arrays["embed.W_E"][0, 0] = value
    return save(arrays, metadata=header["__metadata__"])


def bf16_model(valid, value) -> bytes:
    """A bfloat16 copy of the valid model (its float32 weights truncated to bfloat16, written by the generator's
    writer) with `value` as the first weight of W_E."""
    from tcert.generator.model.files import model_bytes
    arrays = {k: (np.asarray(v, np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
              for k, v in valid["tensors"].items()}
    data = bytearray(model_bytes(arrays, valid["config"], "bfloat16"))
    header, body = split_model(bytes(data))
    lo = header["embed.W_E"]["data_offsets"][0]
    bits = (np.array([value], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return join_model(header, body[:lo] + bits + body[lo + 2:])


def overlap(h):
    """Point W_U's offsets at W_E's bytes (same size in this model)."""
    h["unembed.W_U"]["data_offsets"] = list(h["embed.W_E"]["data_offsets"])


HOSTILE_MODELS = {  # name -> function(valid) -> bytes
    "empty file": lambda v: b"",
    "4 bytes": lambda v: v["model_bytes"][:4],
    "length only": lambda v: v["model_bytes"][:8],
    "truncated header": lambda v: v["model_bytes"][:40],
    "truncated body": lambda v: v["model_bytes"][:-1],
    "half the file": lambda v: v["model_bytes"][: len(v["model_bytes"]) // 2],
    "header length beyond the file": lambda v: struct.pack("<Q", len(v["model_bytes"])) + v["model_bytes"][8:],
    "header length 2^64-1": lambda v: b"\xff" * 8 + v["model_bytes"][8:],
    "header length over 16 MiB": lambda v: struct.pack("<Q", (16 << 20) + 1) + v["model_bytes"][8:],
    "header not JSON": lambda v: join_model(None, b"", b"{not json"),
    "header not UTF-8": lambda v: join_model(None, b"", b'{"a\xff": 1}'),
    "header JSON array": lambda v: join_model(None, b"", b"[]"),
    "header 10^5 nested": lambda v: join_model(None, b"", b"[" * 10 ** 5 + b"]" * 10 ** 5),
    "header NaN literal": lambda v: join_model(None, b"", b'{"a": NaN}'),
    "duplicate tensor key": lambda v: join_model(None, split_model(v["model_bytes"])[1],
                                                 json.dumps(split_model(v["model_bytes"])[0])[:-1].encode()
                                                 + b', "embed.W_E": {"dtype": "F32", "shape": [1], '
                                                   b'"data_offsets": [0, 4]}}'),
    "negative offset": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(
        data_offsets=[-4, h["embed.W_E"]["data_offsets"][1] - 4])),
    "reversed offsets": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(
        data_offsets=h["embed.W_E"]["data_offsets"][::-1])),
    "offsets beyond the body": lambda v: edit_header(v, lambda h: h["unembed.b_U"].update(
        data_offsets=[len(split_model(v["model_bytes"])[1]) - 4, len(split_model(v["model_bytes"])[1]) + 60])),
    "offsets 2^70": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(data_offsets=[2 ** 70, 2 ** 70 + 4])),
    "offset as float": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(data_offsets=[0.0, 1024.0])),
    "offsets wrong size": lambda v: edit_header(v, lambda h: h["embed.W_E"]["data_offsets"].__setitem__(
        1, h["embed.W_E"]["data_offsets"][1] - 4)),
    "overlapping tensors": lambda v: edit_header(v, overlap),
    "absurd shape 2^40": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(shape=[2 ** 40, 2 ** 40])),
    "negative shape": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(shape=[-16, -16])),
    "shape of 100 dims": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(shape=[1] * 100)),
    "shape mismatch": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(shape=[256, 1])),
    "shape as string": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(shape="16,16")),
    "dtype I32": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(dtype="I32")),
    "dtype BF16": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(dtype="BF16")),
    "dtype F8_E4M3": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(dtype="F8_E4M3")),
    "dtype as list": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(dtype=["F32"])),
    "entry extra field": lambda v: edit_header(v, lambda h: h["embed.W_E"].update(extra=1)),
    "entry not an object": lambda v: edit_header(v, lambda h: h.update({"embed.W_E": [1, 2]})),
    "NaN weight F32": lambda v: set_weight(v, "embed.W_E", np.nan),
    "+inf weight F32": lambda v: set_weight(v, "unembed.W_U", np.inf),
    "-inf weight F32": lambda v: set_weight(v, "blocks.0.mlp.b_out", -np.inf),
    "NaN weight F16": lambda v: f16_model(v, np.nan),
    "inf weight F16": lambda v: f16_model(v, np.inf),
    "NaN weight BF16": lambda v: bf16_model(v, np.nan),
    "-inf weight BF16": lambda v: bf16_model(v, -np.inf),
    "missing tensor": lambda v: edit_header(v, lambda h: h.pop("blocks.0.mlp.W_in")),
    "extra tensor": lambda v: edit_header(v, lambda h: h.update({"blocks.1.ln1.w": h["blocks.0.ln1.w"]})),
    "missing config": lambda v: edit_header(v, lambda h: h["__metadata__"].pop("config")),
    "missing metadata": lambda v: edit_header(v, lambda h: h.pop("__metadata__")),
    "metadata not strings": lambda v: edit_header(v, lambda h: h["__metadata__"].update(config={"n_layers": 1})),
    "config not JSON": lambda v: edit_header(v, lambda h: h["__metadata__"].update(config="{n_layers: 1")),
    "config JSON array": lambda v: edit_header(v, lambda h: h["__metadata__"].update(config="[]")),
    "config lies: d_model": lambda v: edit_config(v, d_model=32),
    "config lies: d_vocab": lambda v: edit_config(v, d_vocab=17),
    "config lies: n_layers": lambda v: edit_config(v, n_layers=2),
    "config lies: no shared LN": lambda v: edit_config(v, shared_ln=False),
    "config lies: learned positions": lambda v: edit_config(v, positional_embedding_type="standard"),
    "config lies: attn_only": lambda v: edit_config(v, attn_only=True),
    "config missing d_model": lambda v: edit_config(v, d_model=None),
    "config n_layers 0": lambda v: edit_config(v, n_layers=0),
    "config d_model true": lambda v: edit_config(v, d_model=True),
    "config unknown field": lambda v: edit_config(v, d_embed=16),
    "config act_fn swish": lambda v: edit_config(v, act_fn="swish"),
    "config lies: gated MLP": lambda v: edit_config(v, gated_mlp=True),
    "config lies: RMSNorm": lambda v: edit_config(v, normalization_type="RMS"),
    "config lies: grouped keys": lambda v: edit_config(v, n_key_value_heads=1),
    "config n_key_value_heads not a divisor": lambda v: edit_config(v, n_key_value_heads=3),
    "config n_key_value_heads 0": lambda v: edit_config(v, n_key_value_heads=0),
    "config attention and attention_dir": lambda v: edit_config(v, attention="causal", attention_dir="causal"),
    "config attn_scale without use_attn_scale": lambda v: edit_config(v, use_attn_scale=False, attn_scale="2"),
    "config rotary_scaling_factor 0": lambda v: edit_config(v, rotary_scaling_factor=0),
    "config normalization_type LNPre": lambda v: edit_config(v, normalization_type="LNPre"),
    "config eps NaN": lambda v: edit_config(v, eps="nan"),
    "config eps 0": lambda v: edit_config(v, eps=0),
    "config eps exponent bomb": lambda v: edit_config(v, eps="1e-999999999"),
    "config attn_scale exponent bomb": lambda v: edit_config(v, attn_scale="1e999999999"),
    "config rotary_base 10^6 digits": lambda v: edit_config(v, rotary_base="1" * 10 ** 6),
    "config rotary_dim odd": lambda v: edit_config(v, rotary_dim=3),
    "config rotary_dim > d_head": lambda v: edit_config(v, rotary_dim=64),
    "pickle bytes": lambda v: pickle.dumps({"embed.W_E": np.zeros((4, 4), np.float32)}),
    "zip (torch.save) bytes": lambda v: b"PK\x03\x04" + b"\x00" * 200,
    "certificate given as model": lambda v: v["cert_bytes"],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MODELS))
def test_hostile_model_file(valid, tmp_path, capsys, case):
    """A broken model file: exit 2, one ERROR line naming the model file or its config."""
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(HOSTILE_MODELS[case](valid))
    with time_limit():
        with pytest.raises(BadInput):
            load_model(str(path))
    code, line = run(capsys, valid["cert_path"], path)
    assert code == 2 and (line.startswith("ERROR: model file") or line.startswith("ERROR: model config")), line


def test_model_path_not_a_file(valid, tmp_path, capsys):
    """A directory or a missing path as the model: exit 2."""
    for path in (tmp_path, tmp_path / "missing.safetensors"):
        code, line = run(capsys, valid["cert_path"], path)
        assert code == 2 and line.startswith("ERROR: model file: cannot read"), line


@pytest.mark.parametrize("case", sorted(ENVELOPE_ERRORS))
def test_hostile_certificate_cli(valid, tmp_path, capsys, case):
    """Every malformed certificate of test_envelope through the CLI: exit 2, one line, in time."""
    path = tmp_path / "hostile.json"
    path.write_bytes(ENVELOPE_ERRORS[case][0])
    code, line = run(capsys, path, valid["model_path"])
    assert code == 2 and line.startswith("ERROR: certificate"), line


def test_hostile_keys_stay_one_line(valid, tmp_path, capsys):
    """Keys with line breaks, control characters or lone surrogates are escaped in the one line."""
    for key in ("a\nb", "a\rb", "a\u2028b", "\ud800", "\x1b[2J", "tab\there"):
        for where in ("claim", "evidence"):
            doc = dict(valid["cert"], **{where: {key: 1.5}})
            path = tmp_path / "k.json"
            path.write_bytes(json.dumps(doc).encode("utf-8", "surrogatepass"))
            code, line = run(capsys, path, valid["model_path"])
            assert code == 2 and "JSON float" in line, line
            code, line = run(capsys, path, valid["model_path"], "--json")
            assert code == 2 and json.loads(line)["verdict"] == "ERROR"


# --- the model reader's limits, at the limit and one past ----------------------------------------------

def test_model_file_size_limit(valid, monkeypatch):
    """A model file of exactly MAX_MODEL_BYTES is read; one byte over the limit is refused."""
    size = len(valid["model_bytes"])
    monkeypatch.setattr(modelfile, "MAX_MODEL_BYTES", size)
    assert load_model(str(valid["model_path"])).sha256 == valid["model"].sha256
    monkeypatch.setattr(modelfile, "MAX_MODEL_BYTES", size - 1)
    with pytest.raises(BadInput, match="larger than"):
        load_model(str(valid["model_path"]))


def test_model_header_size_limit(valid, monkeypatch):
    """A header of exactly MAX_HEADER_BYTES is read; one byte over is refused."""
    n = int.from_bytes(valid["model_bytes"][:8], "little")
    monkeypatch.setattr(modelfile, "MAX_HEADER_BYTES", n)
    modelfile.parse_model_bytes(valid["model_bytes"])
    monkeypatch.setattr(modelfile, "MAX_HEADER_BYTES", n - 1)
    with pytest.raises(BadInput, match="header length"):
        modelfile.parse_model_bytes(valid["model_bytes"])


def test_tensor_count_limit(valid, monkeypatch):
    """A file with exactly MAX_TENSORS tensors is read; one more than the limit is refused."""
    n = len(valid["model"].tensors)
    monkeypatch.setattr(modelfile, "MAX_TENSORS", n)
    modelfile.parse_model_bytes(valid["model_bytes"])
    monkeypatch.setattr(modelfile, "MAX_TENSORS", n - 1)
    with pytest.raises(BadInput, match="more than"):
        modelfile.parse_model_bytes(valid["model_bytes"])


@pytest.mark.parametrize("key,limit", [("d_model", modelfile.MAX_DIM), ("d_vocab", modelfile.MAX_DIM),
                                       ("n_ctx", modelfile.MAX_DIM), ("n_layers", 64), ("n_heads", 1024)])
def test_config_size_limits(valid, key, limit):
    """Config sizes: each dimension up to 2^22, n_layers up to 64, n_heads up to 1024; one more fails."""
    cfg = dict(valid["config"])
    cfg[key] = limit
    assert getattr(parse_config(cfg), key) == limit
    cfg[key] = limit + 1
    with pytest.raises(BadInput):
        parse_config(cfg)


def test_default_model_limits():
    """The limits in force are the documented ones."""
    assert modelfile.MAX_MODEL_BYTES == 8 << 30 and modelfile.MAX_HEADER_BYTES == 16 << 20
    assert modelfile.MAX_TENSORS == 4096 and modelfile.MAX_DIM == 1 << 22


# --- the real CLI in a subprocess: nothing on stderr --------------------------------------------------

@pytest.mark.parametrize("case", [
    ("certificate", "10^5 nested arrays"), ("certificate", "non-UTF-8 (latin-1)"), ("certificate", "truncated"),
    ("model", "NaN weight F32"), ("model", "pickle bytes"), ("model", "config attn_scale exponent bomb"),
    ("model", "header length 2^64-1"),
])
def test_subprocess_no_traceback(valid, tmp_path, case):
    """`python -m checker.cli` on hostile input: exit 2, one stdout line, empty stderr, no hang."""
    what, name = case
    cert_path, model_path = valid["cert_path"], valid["model_path"]
    if what == "certificate":
        cert_path = tmp_path / "hostile.json"
        cert_path.write_bytes(ENVELOPE_ERRORS[name][0])
    else:
        model_path = tmp_path / "hostile.safetensors"
        model_path.write_bytes(HOSTILE_MODELS[name](valid))
    rss = tmp_path / "rss"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TCERT_TEST_RSS=str(rss))
    for cmd in (["-m", "checker.cli"], ["-c", MEASURED_MAIN]):
        proc = subprocess.run([sys.executable, *cmd, str(cert_path), "--model", str(model_path)],
                              capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
        assert proc.returncode == 2, proc
        assert proc.stderr == "" and "Traceback" not in proc.stdout
        assert len(proc.stdout.splitlines()) == 1 and proc.stdout.startswith("ERROR: ")
    # No memory blow-up: the checker process peaked below 1 GiB (its own VmHWM, in KiB).
    assert int(rss.read_text()) < 1 << 20


# tcert-check's main() in a child that reports its own peak memory (KiB) to $TCERT_TEST_RSS.
# The child's own peak (VmHWM, KiB): ru_maxrss would also count the pytest parent's RSS at fork time, which
# Linux carries across exec.
MEASURED_MAIN = ("import os, re, sys\nfrom checker.cli import main\ncode = main(sys.argv[1:])\n"
                 "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
                 "open(os.environ['TCERT_TEST_RSS'], 'w').write(hwm)\nsys.exit(code)")


def test_subprocess_verified_and_rejected(valid, tmp_path):
    """The same subprocess route says VERIFIED (exit 0) and REJECTED (exit 1) where it should."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "checker.cli", str(valid["cert_path"]), "--model", str(valid["model_path"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == 0 and proc.stdout.startswith("VERIFIED: prediction") and proc.stderr == ""
    other = tmp_path / "other.safetensors"
    tensors, config = random_model("neox1l", seed=6)
    save_model(str(other), tensors, config)
    cmd[-1] = str(other)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == 1 and proc.stdout.startswith("REJECTED: model binding") and proc.stderr == ""


# --- byte-level fuzzing of valid files -----------------------------------------------------------------

def mutate(data: bytes, edits) -> bytes:
    """Apply (kind, position, byte) edits: 0 replace, 1 insert, 2 delete, 3 truncate, 4 change a digit
    (which keeps the JSON well formed, so the edit reaches the claim's numbers and tokens)."""
    out = bytearray(data)
    for kind, pos, byte in edits:
        if not out:
            break
        pos %= len(out)
        if kind == 4:
            digits = [i for i, b in enumerate(out) if 48 <= b <= 57]
            if digits:
                out[digits[pos % len(digits)]] = 48 + byte % 10
        elif kind == 0:
            out[pos] = byte
        elif kind == 1:
            out.insert(pos, byte)
        elif kind == 2:
            del out[pos]
        else:
            del out[pos:]
    return bytes(out)


edits_strategy = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 30), st.integers(0, 255)),
                          min_size=1, max_size=3)


def claim_is_true(model, claim) -> bool:
    """Float oracle for a prediction claim that the checker verified (float error allowed for)."""
    tokens, k = claim["tokens"], claim["predicted"]
    margin = parse_number(claim["margin"], "margin")
    f = float_logits(model, np.asarray([tokens]))[0]
    gap = Fraction(float(f[k] - np.delete(f, k).max()))
    return gap >= margin - Fraction(1, 10 ** 6)


@settings(max_examples=fuzz_examples(150))
@given(edits=edits_strategy)
def test_fuzz_certificate_bytes(valid, tmp_path_factory, edits):
    """Mutated certificate bytes: exit 0/1/2 (never 3), one line; VERIFIED only for a true claim."""
    data = mutate(valid["cert_bytes"], edits)
    path = tmp_path_factory.mktemp("fz") / "c.json"
    path.write_bytes(data)
    start = time.perf_counter()
    with time_limit(), contextlib.redirect_stdout(open(os.devnull, "w")):
        code = cli.main([str(path), "--model", str(valid["model_path"])])
    assert time.perf_counter() - start < TIME_LIMIT
    assert code in (0, 1, 2)
    if code == 0:
        assert claim_is_true(valid["model"], json.loads(data)["claim"])


@settings(max_examples=fuzz_examples(100))
@given(edits=edits_strategy)
def test_fuzz_model_bytes(valid, tmp_path_factory, edits):
    """Mutated model bytes: exit 1 (model binding) or 2, never VERIFIED, never 3."""
    data = mutate(valid["model_bytes"], edits)
    path = tmp_path_factory.mktemp("fz") / "m.safetensors"
    path.write_bytes(data)
    start = time.perf_counter()
    with time_limit(), contextlib.redirect_stdout(open(os.devnull, "w")):
        code = cli.main([str(valid["cert_path"]), "--model", str(path)])
    assert time.perf_counter() - start < TIME_LIMIT
    assert code == 0 if data == valid["model_bytes"] else code in (1, 2)


ODD_VALUES = st.sampled_from([None, True, -1, 0, 1, 3, 2 ** 31, 2 ** 64, 2 ** 70, -(2 ** 63), 0.5, 1e308, "F32",
                              "F16", "F64", "BF16", "I64", "", "x" * 1000, [], [0], [1, 2], [-1, 5], [0, 2 ** 64],
                              [[1]], {}, {"a": 1}, [2 ** 22, 2 ** 22], [1] * 50])


@settings(max_examples=fuzz_examples(200))
@given(data=st.data())
def test_fuzz_model_header(valid, data):
    """Safetensors headers with fields replaced by odd values (offsets, shapes, dtypes, metadata,
    config entries): the reader returns a Model or raises BadInput, never anything else, in time."""
    header, body = split_model(valid["model_bytes"])
    names = sorted(header)
    for _ in range(data.draw(st.integers(1, 4), "edits")):
        name = data.draw(st.sampled_from(names), "tensor")
        if name not in header:  # removed by an earlier edit
            continue
        if name == "__metadata__":
            cfg = json.loads(header[name]["config"])
            key = data.draw(st.sampled_from(sorted(cfg) + ["rotary_dim", "attn_scale", "eps", "extra"]), "key")
            cfg[key] = data.draw(ODD_VALUES | st.text(max_size=12), "config value")
            header[name]["config"] = json.dumps(cfg)
        else:
            field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra", None]), "field")
            if field is None:
                header.pop(name)
            else:
                header[name][field] = data.draw(ODD_VALUES, "value")
    blob = join_model(header, body)
    start = time.perf_counter()
    with time_limit():
        try:
            modelfile.parse_model_bytes(blob)
        except BadInput:
            pass
    assert time.perf_counter() - start < TIME_LIMIT


def test_config_number_text_limits():
    """Config numbers: 100 characters and |exponent| <= 100 are read; 101 characters or exponent 101
    are refused before any big integer is built."""
    at_length, past_length = "1." + "0" * 98, "1." + "0" * 99
    assert len(at_length) == 100 and modelfile._exact_config_number(at_length, "eps") == 1
    at_exp, past_exp = "0." + "0" * 89 + "1e100", "0." + "0" * 90 + "1e101"
    assert modelfile._exact_config_number(at_exp, "eps") == 10 ** 10
    for text in (past_length, past_exp):
        with pytest.raises(BadInput):
            modelfile._exact_config_number(text, "eps")


def test_prec_limits(valid, capsys):
    """--prec 30 and 4096 are accepted (at 30 bits the enclosures are too wide for this certificate's
    tight margin: the prediction kind raises its precision by itself and says at which it verified); 29 and
    4097 are exit 2."""
    for prec, expected in (("30", 0), ("4096", 0), ("29", 2), ("4097", 2)):
        code, line = run(capsys, valid["cert_path"], valid["model_path"], "--prec", prec)
        assert code == expected, (prec, line)
        if prec == "30":
            assert " at 30 bits)" not in line and " bits)" in line, line
