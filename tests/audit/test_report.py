"""The audit report (`tcert-check ... --report FILE.html|.md`), loaded in a real browser.

Headless Chromium from Debian's packages (installed by .ci/run) opens each page with the network off; the
rendered DOM must hold the verdict, the model's SHA-256 and one row per obligation checked, and a
REJECTED page the failing obligation with its numbers. The page is self-contained (no network, no external
asset, no script) and escapes everything a certificate says.
"""

import json
import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser

import pytest

from tcert.checker import cli
from tcert.testing import CERTIFICATES

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
CASES = {   # one shipped certificate per kind (and per overwhelm method family)
    "prediction": None,
    "overwhelm lp": ("overwhelm/perm_lp.json", "overwhelm/neox1l_tiny.safetensors"),
    "overwhelm tight": ("overwhelm/neox_real_perm.json", "overwhelm/neox_real_tiny.safetensors"),
    "accuracy cubic": ("accuracy/maxof4_seed123_cubic.json", "models/maxof4_seed123.safetensors"),
    "accuracy subcubic": ("accuracy/maxof4_seed123_subcubic_svd.json", "models/maxof4_seed123.safetensors"),
    "influence corollary": ("influence/robust2.corollary.json", "influence/robust2.safetensors"),
}
# Off a CI run, a machine without Chromium skips these tests; .ci/run installs it, and there they must run.
needs_browser = pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.environ.get("CI"),
                                   reason="headless Chromium (Debian's chromium package: apt-get install chromium)")


class Dom(HTMLParser):
    """The elements of a rendered DOM: tag, attributes and the text inside, as a flat list."""

    def __init__(self, text):
        super().__init__()
        self.elements, self.open = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(el)
        if tag not in ("meta", "br", "img", "input", "link", "rect", "line"):
            self.open.append(el)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for el in self.open:
            el["text"] += data

    def find(self, tag=None, cls=None, id=None):
        return [e for e in self.elements if (tag is None or e["tag"] == tag)
                and (cls is None or cls in (e["attrs"].get("class") or "").split())
                and (id is None or e["attrs"].get("id") == id)]


def chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)


def rendered(tmp_path, page) -> Dom:
    """The DOM of `page` as headless Chromium renders it."""
    proc = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return Dom(proc.stdout)


def check_with_report(capsys, tmp_path, cert, model, name="report.html", *extra):
    """Run tcert-check with --json and --report; return (exit code, JSON result, report path)."""
    out = tmp_path / name
    code = cli.main([str(cert), "--model", str(model), "--json", "--report", str(out), *extra])
    r = json.loads(capsys.readouterr().out)
    return code, r, out


@pytest.fixture(scope="module")
def prediction_case(tmp_path_factory):
    from tcert.checker.modelfile import load_model
    from tcert.generator.certificate import write
    from tcert.generator.prediction import prediction_certificate
    d = tmp_path_factory.mktemp("pred")
    model = CERTIFICATES / "models" / "maxof4_seed123.safetensors"
    cert, _ = prediction_certificate(load_model(str(model)), [3, 10, 17, 24])
    write(str(d / "prediction.json"), cert)
    return d / "prediction.json", model


def case_files(name, prediction_case):
    if CASES[name] is None:
        return prediction_case
    return tuple(CERTIFICATES / p for p in CASES[name])


def self_contained(text: str):
    """No script, no external load of any kind (the only URL is the SVG namespace)."""
    assert "<script" not in text.lower() and "<link" not in text.lower() and "@import" not in text
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"\bsrc\s*=", text)
    assert "default-src 'none'" in text


@needs_browser
@pytest.mark.parametrize("name", sorted(CASES))
def test_verified_report_in_a_real_browser(capsys, tmp_path, prediction_case, name):
    cert, model = case_files(name, prediction_case)
    code, r, page = check_with_report(capsys, tmp_path, cert, model)
    assert code == 0 and r["verdict"] == "VERIFIED"
    self_contained(page.read_text(encoding="utf-8"))
    dom = rendered(tmp_path, page)
    verdict, = dom.find(id="verdict")
    assert verdict["text"].startswith("VERIFIED: ") and "VERIFIED" in verdict["attrs"]["class"]
    assert r["model_sha256"] in dom.find(id="model")[0]["text"]
    rows = dom.find("tr", cls="obligation")
    assert len(rows) == len(r["obligations"]) and r["obligations"]
    for row, ob in zip(rows, r["obligations"]):
        assert ob["name"] in row["text"]
    assert dom.find(id="statement")[0]["text"] == r["statement"]
    environment = dom.find(id="environment")[0]["text"]
    for v in r["versions"].values():
        assert v in environment
    assert f"tcert-check {cert} --model {model} --backend flint --prec 64" in environment
    if name.startswith("accuracy"):
        assert "inputs covered / inputs, by max token" in page.read_text()
    if any("evidence.deviation" in o["figures"] for o in r["obligations"]):    # overwhelm naive/lp records W
        assert "W vs PTP/2" in page.read_text()
    md = page.with_suffix(".md")
    assert cli.main([str(cert), "--model", str(model), "--report", str(md)]) == 0
    capsys.readouterr()
    text = md.read_text(encoding="utf-8")
    assert "**VERIFIED**" in text and r["model_sha256"] in text
    assert sum(1 for line in text.splitlines() if re.match(r"\| \d+ \| ", line)) == len(r["obligations"])


@needs_browser
def test_rejected_report_names_the_failing_obligation(capsys, tmp_path, prediction_case):
    cert_path, model = prediction_case
    cert = json.loads(cert_path.read_text())
    cert["claim"]["margin"] = "40"
    del cert["statement"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cert))
    code, r, page = check_with_report(capsys, tmp_path, bad, model)
    assert code == 1 and r["obligation"] == "prediction: logit gap"
    dom = rendered(tmp_path, page)
    assert dom.find(id="verdict")[0]["text"].startswith("REJECTED: prediction: logit gap: ")
    failed, = dom.find("tr", cls="failed")
    assert "prediction: logit gap" in failed["text"] and "is not >= claimed margin 40" in failed["text"]
    assert len(dom.find("tr", cls="obligation")) == len(r["obligations"]) + 1


@needs_browser
def test_error_still_yields_a_page(capsys, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_bytes(b'{"format": "tcert-certificate", "version": 1')
    code, r, page = check_with_report(capsys, tmp_path, bad, CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors")
    assert code == 2 and page.exists()
    dom = rendered(tmp_path, page)
    assert dom.find(id="verdict")[0]["text"].startswith("ERROR: certificate: not valid JSON")
    from tcert.checker.modelfile import load_model
    sha = load_model(str(CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors")).sha256
    assert sha in dom.find(id="model")[0]["text"] and "model_sha256" not in r   # the check never read the model


@needs_browser
def test_hostile_text_is_escaped(capsys, tmp_path):
    """Markup in the informational fields (read by no rule) is shown as text: no element of it reaches the DOM."""
    cert = json.loads((CERTIFICATES / "overwhelm" / "perm_lp.json").read_text())
    cert["generator"]["note"] = '<script>document.title="owned"</script><img src=x onerror=alert(1)>'
    cert["model"]["file"] = "</td></tr></table><h1 id=verdict>VERIFIED</h1>"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(cert))
    code, r, page = check_with_report(capsys, tmp_path, path, CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors")
    assert code == 0
    text = page.read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text
    dom = rendered(tmp_path, page)
    assert not dom.find("script") and not dom.find("img") and len(dom.find(id="verdict")) == 1
    assert "owned" not in dom.find("title")[0]["text"]


@needs_browser
def test_screenshot(capsys, tmp_path):
    """Chromium renders the page to a PNG of the asked size (docs/audit-report.png is made the same way)."""
    cert, model = (CERTIFICATES / p for p in CASES["accuracy cubic"])
    _, _, page = check_with_report(capsys, tmp_path, cert, model)
    png = tmp_path / "shot.png"
    proc = chromium(tmp_path, f"--screenshot={png}", "--window-size=1000,1400", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1000, 1400)


def test_overwhelm_plots_read_the_recorded_figures():
    """W against PTP/2 from the figures "evidence.deviation" and "evidence.sample.margin", and one chart per
    per-head list figure; the numbers printed are the checker's show() of the exact values."""
    from fractions import Fraction
    from tcert.audit.plots import overwhelm_plots
    from tcert.checker.obligations import Obligation
    obs = [Obligation("overwhelm lp: sample margin (PTP)", 0.01, {"evidence.sample.margin": Fraction(1, 4)}),
           Obligation("overwhelm lp: deviation bound", 0.01, {"evidence.deviation": Fraction(1, 16),
                                                             "deviation per head": [Fraction(1, 32), Fraction(-1, 32)]})]
    (cap, svg), (cap2, svg2) = overwhelm_plots(obs)
    assert "W vs PTP/2" in svg and ">0.0625<" in svg and ">0.125<" in svg and "PTP/2 - W" in svg
    assert cap2.endswith("deviation per head") and ">0.03125<" in svg2 and ">-0.03125<" in svg2
    assert overwhelm_plots(obs[:1]) == []
