"""The fuzz campaign for hostile inputs: case builders per class, and a runner that checks each case with
both backends under a time and memory cap and tallies the outcomes.

Classes (what once broke the checker, docs/soundness.md "Hostile input"):
- weights: extreme exponents in the weights (one matrix scaled by 10^e, |e| <= 30, or single entries set
  to +-3e38, 1e-45 (subnormal) or 0), honest certificates from our generator where it can write one;
- numbers: extreme certificate numbers (hex floats with exponents near +-4096, 400-digit ratios, zero,
  sign flips) written into a valid certificate's numeric fields;
- attention: sharp and flat attention (attn_scale 1/10^4 .. 10^4, W_Q scaled 10^-6 .. 10^3), honest
  prediction, lp and tight certificates;
- context: huge declared contexts (n_ctx up to 2^22) with claims of up to 10^5 tokens;
- degenerate: d_vocab 1 or 2, d_model / d_head / n_heads / d_mlp 1, for each kind;
- json: deep and wide JSON (nesting to 10^5, 10^6-element lists, 10^5 keys, long strings).

`run_campaign(per_class, seed, workdir)` returns one record per case; `tally(records)` the table that
docs/soundness.md reports. A case passes when both backends end in exit 0, 1 or 2 with one line, the
same exit code, each within TIME_CAP seconds and MEMORY_CAP bytes above the process's baseline RSS,
checked under the resource limits LIMITS.
"""

import contextlib
import io
import json
import random
import signal
import time

import numpy as np

from tcert.checker import cli
from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model
from tcert.generator import certificate
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model
from tcert.testing import CERTIFICATES
from tcert.testing.overwhelm import tiny_neox1l

CLASSES = ("weights", "numbers", "attention", "context", "degenerate", "json")
TIME_CAP = 30.0          # seconds per backend run
MEMORY_CAP = 1 << 30     # bytes of RSS above the baseline per case
# The resource limits the campaign checks under: what the model admits must then finish within the caps
# on both backends (1e6 operations: about 1 s with Arb, under 30 s with mpmath), which tests its
# calibration; the defaults (1e10, 16 GiB) admit hours of honest work.
LIMITS = ("--max-work", "1e6", "--max-memory", "1")


# --- building cases: each returns (certificate bytes, model path, what) ----------------------------

def write_model(workdir, name, tensors_cfg):
    path = f"{workdir}/{name}.safetensors"
    save_model(path, *tensors_cfg)
    return path, load_model(path)


def honest(model, rng, kinds=("prediction", "lp", "tight")):
    """A certificate our generator writes for `model` (kind drawn from `kinds`), or None when it refuses
    (BadInput, a near-tie). Other generator exceptions propagate: the runner tallies them."""
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.overwhelm.tight import generate_tight
    from tcert.generator.prediction import prediction_certificate
    v, kind = model.config.d_vocab, rng.choice(kinds)
    try:
        if kind == "prediction":
            return prediction_certificate(model, [rng.randrange(v) for _ in range(rng.randint(1, 6))])[0]
        prefix, query = [rng.randrange(v)] * rng.randint(1, min(12, model.config.n_ctx - 4)), rng.randrange(v)
        free = ("perm", 3, [rng.randrange(v) for _ in range(3)])
        if kind == "lp":
            return generate(model, prefix, query, free, "lp", "table", force=True)[0]
        return generate_tight(model, prefix, query, free, force=True)[0]
    except BadInput:
        return None


def rebound(cert: dict, model) -> dict:
    """`cert` bound to `model` (its model_sha256 replaced): the checker must judge it on that model."""
    return dict(cert, model_sha256=model.sha256)


def base_overwhelm(workdir, rng):
    """(model path, model) of a tiny neox1l with a random seed."""
    return write_model(workdir, "base", tiny_neox1l(rng.randrange(1000), qk_scale=rng.choice([0.3, 1.0])))


def case_weights(workdir, rng):
    tensors, cfg = tiny_neox1l(rng.randrange(1000))
    name = rng.choice(sorted(tensors))
    if rng.random() < 0.5:
        e = rng.randint(-30, 30)
        tensors[name] = (tensors[name].astype(np.float64) * 10.0 ** e).astype(np.float32)
        what = f"{name} x 1e{e}"
    else:
        value = rng.choice([3e38, -3e38, 1e-45, -1e-45, 0.0])
        flat = tensors[name].reshape(-1).copy()
        flat[rng.randrange(flat.size)] = value
        tensors[name] = flat.reshape(tensors[name].shape)
        what = f"{name}[one] = {value:g}"
    path, model = write_model(workdir, "w", (tensors, cfg))
    cert = honest(model, rng)
    if cert is None:
        _, normal = base_overwhelm(workdir, rng)
        cert = rebound(honest(normal, rng, ("prediction",)) or {}, model)
    return certificate.dumps(cert).encode(), path, what


EXTREME_NUMBERS = ["0x1.fffffffffffffp+4095", "-0x1p+4096", "0x1p-4096", "0x0p+0", "-0x1.8p-4000",
                   "1" + "0" * 399, "-" + "9" * 400, "1/" + "7" * 400, "3" * 400 + "/" + "7" * 399, "0", "-1"]


def numeric_slots(value, path=()):
    """Paths of every number-looking string in a certificate's claim and evidence."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in numeric_slots(v, path + (k,))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in numeric_slots(v, path + (i,))]
    return [path] if isinstance(value, str) and value[:1] in "-0123456789" else []


def shipped_fast():
    """(certificate path, model path) of the shipped certificates that check in well under a second."""
    ow, inf = CERTIFICATES / "overwhelm", CERTIFICATES / "influence"
    return [(ow / "perm_lp.json", ow / "neox1l_tiny.safetensors"),
            (inf / "robust2.influence.json", inf / "robust2.safetensors"),
            (inf / "toy2_bidir.influence.json", inf / "toy2_bidir.safetensors"),
            (inf / "robust2.corollary.json", inf / "robust2.safetensors")]


def case_numbers(workdir, rng):
    cert_path, model_path = rng.choice(shipped_fast())
    cert = json.loads(cert_path.read_text())
    slots = numeric_slots({"claim": cert["claim"], "evidence": cert["evidence"]})
    edits = []
    for _ in range(rng.randint(1, 4)):
        where = rng.choice(slots)
        node = cert
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = rng.choice(EXTREME_NUMBERS)
        edits.append(".".join(map(str, where)))
    return certificate.dumps(cert).encode(), str(model_path), f"{cert_path.name}: {', '.join(edits)}"


def case_attention(workdir, rng):
    scale, wq = rng.choice(["1/10000", "1/100", "1/10", "100", "10000"]), 10.0 ** rng.randint(-6, 3)
    tensors, cfg = tiny_neox1l(rng.randrange(1000), qk_scale=1.0, attn_scale=scale)
    tensors["blocks.0.attn.W_Q"] = (tensors["blocks.0.attn.W_Q"] * wq).astype(np.float32)
    path, model = write_model(workdir, "a", (tensors, cfg))
    cert = honest(model, rng)
    if cert is None:
        _, normal = base_overwhelm(workdir, rng)
        cert = rebound(honest(normal, rng, ("tight",)) or {}, model)
    return certificate.dumps(cert).encode(), path, f"attn_scale {scale}, W_Q x {wq:g}"


def case_context(workdir, rng):
    from tcert.generator.prediction import prediction_certificate
    n_ctx, layers = 1 << rng.randint(10, 22), rng.randint(1, 3)
    path, model = write_model(workdir, "ctx", random_model(
        "preln", d_vocab=4, d_model=4, n_heads=1, d_head=4, d_mlp=4, n_ctx=n_ctx, n_layers=layers,
        seed=rng.randrange(1000), positional_embedding_type=rng.choice(["none", "rotary"])))
    cert = prediction_certificate(model, [1, 2, 3])[0] or prediction_certificate(model, [0, 1])[0]
    # sizes the resource model admits stay small enough for mpmath (20x Arb); the others it must refuse
    n = rng.choice([10, 100, 10 ** 5, 10 ** 6] if layers > 1 else [10, 1000, 10 ** 6])   # may exceed n_ctx
    cert = dict(cert, claim=dict(cert["claim"], tokens=[rng.randrange(4) for _ in range(n)]))
    return certificate.dumps(cert).encode(), path, f"n_ctx 2^{n_ctx.bit_length() - 1}, {n} tokens"


def case_degenerate(workdir, rng):
    from tcert.generator.influence import influence_certificate, toy_model
    dims = dict(d_vocab=rng.choice([1, 2]), d_model=rng.choice([1, 2, 4]), n_heads=rng.choice([1, 2]),
                d_head=rng.choice([1, 2]), d_mlp=rng.choice([1, 2]))
    family = rng.choice(["neox1l", "preln", "attn-only", "influence"])
    if family == "neox1l":
        dims["d_head"] = 2   # rotary needs an even rotary_dim
    seed = rng.randrange(1000)
    if family == "influence":
        tc = toy_model(n_layers=2, d_vocab=max(dims["d_vocab"], 2), d_model=dims["d_model"], n_heads=dims["n_heads"],
                       d_head=dims["d_head"], d_mlp=dims["d_mlp"], n_ctx=5, seed=seed)
    else:
        tc = random_model(family, n_ctx=8, seed=seed, **dims)
    path, model = write_model(workdir, "deg", tc)
    try:
        cert = influence_certificate(model) if family == "influence" else honest(model, rng)
    except BadInput:
        cert = None
    if cert is None:   # our generator refused: a valid certificate of another model, bound to this one
        _, normal = base_overwhelm(workdir, rng)
        cert = rebound(honest(normal, rng, ("prediction", "lp")) or {}, model)
    return certificate.dumps(cert).encode(), path, f"{family} {dims}"


def case_json(workdir, rng):
    _, model_path = shipped_fast()[0]
    cert = json.loads((CERTIFICATES / "overwhelm" / "perm_lp.json").read_text())
    shape = rng.choice(["deep", "wide", "keys", "string", "deep-in-field", "objects"])
    n = rng.choice([10, 1000, 10 ** 5]) if shape == "deep" else rng.choice([10 ** 3, 10 ** 5, 10 ** 6])
    if shape == "deep":
        data = b"[" * n + b"]" * n
    elif shape == "objects":
        data = b"[" + b"{}," * (n - 1) + b"{}]"
    else:
        if shape == "wide":
            cert["evidence"]["lp_duals"][0]["max"]["u"] = ["0x1p+0"] * n
        elif shape == "keys":
            cert["evidence"].update({f"k{i}": i for i in range(n)})
        elif shape == "string":
            cert["claim"]["prefix"] = "7" * n * 10
        else:
            cert["claim"]["free"]["tokens"] = json.loads("[" * min(n, 20) + "]" * min(n, 20))
        data = certificate.dumps(cert).encode()
    return data, str(model_path), f"{shape} {n}"


BUILDERS = {"weights": case_weights, "numbers": case_numbers, "attention": case_attention,
            "context": case_context, "degenerate": case_degenerate, "json": case_json}


# --- running ---------------------------------------------------------------------------------------

def rss(field: str) -> int:
    """VmRSS or VmHWM of this process, in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM after `seconds`: a hang becomes an exception (the CLI reports it as exit 3, a failure)."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_case(cert_path: str, model_path: str) -> list:
    """[(backend, exit code, output lines, seconds, peak RSS above the baseline)] of tcert-check."""
    out = []
    for backend in ("flint", "mpmath"):
        with open("/proc/self/clear_refs", "w") as f:   # reset VmHWM to the current RSS
            f.write("5")
        base, buf, start = rss("VmRSS"), io.StringIO(), time.perf_counter()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), time_limit(TIME_CAP * 2):
            code = cli.main([cert_path, "--model", model_path, "--backend", backend, *LIMITS])
        out.append((backend, code, buf.getvalue().splitlines(), time.perf_counter() - start, rss("VmHWM") - base))
    return out


def run_case(cls: str, index: int, seed: int, workdir: str) -> dict:
    """Build case `index` of class `cls` and check it: one record (passed, exits, seconds, rss, what)."""
    rng = random.Random(f"{seed}:{cls}:{index}")
    try:
        data, model_path, what = BUILDERS[cls](workdir, rng)
    except BadInput as e:   # the model writer refused the drawn dimensions (e.g. rotary with d_head 1)
        return {"class": cls, "index": index, "passed": True, "generator_crash": None, "refused": str(e)[:200],
                "exits": [], "seconds": 0.0, "rss": 0, "what": ""}
    except Exception as e:   # a generator crash on this model: tallied (a user's problem, not a trust one)
        return {"class": cls, "index": index, "passed": True, "generator_crash": f"{type(e).__name__}: {e}"[:200],
                "exits": [], "seconds": 0.0, "rss": 0, "what": ""}
    cert_path = f"{workdir}/case.json"
    with open(cert_path, "wb") as f:
        f.write(data)
    runs = check_case(cert_path, model_path)
    passed = (all(code in (0, 1, 2) and len(lines) == 1 for _, code, lines, _, _ in runs)
              and len({code for _, code, _, _, _ in runs}) == 1
              and all(s < TIME_CAP and m < MEMORY_CAP for _, _, _, s, m in runs))
    return {"class": cls, "index": index, "passed": passed, "generator_crash": None,
            "exits": [code for _, code, _, _, _ in runs], "seconds": max(s for *_, s, _ in runs),
            "rss": max(m for *_, m in runs), "what": what,
            "lines": [lines[0][:300] if lines else "" for _, _, lines, _, _ in runs]}


def run_campaign(per_class: int, seed: int, workdir: str, classes=CLASSES) -> list:
    return [run_case(cls, i, seed, workdir) for cls in classes for i in range(per_class)]


def tally(records: list) -> str:
    """Per class: cases, exit codes (0/1/2, other), failures, generator crashes, max seconds, max RSS (MiB).
    A case whose model the writer refused (BadInput while building) counts as a case without exits."""
    rows = ["| class | cases | exit 0 | exit 1 | exit 2 | other | failed | generator crashes | max s | max MiB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for cls in sorted({r["class"] for r in records}, key=CLASSES.index):
        rs = [r for r in records if r["class"] == cls]
        exits = [r["exits"][0] for r in rs if r["exits"]]
        rows.append(f"| {cls} | {len(rs)} | {exits.count(0)} | {exits.count(1)} | {exits.count(2)} | "
                    f"{sum(e not in (0, 1, 2) for e in exits)} | {sum(not r['passed'] for r in rs)} | "
                    f"{sum(r['generator_crash'] is not None for r in rs)} | {max(r['seconds'] for r in rs):.2f} | "
                    f"{max(r['rss'] for r in rs) / (1 << 20):.0f} |")
    return "\n".join(rows)
