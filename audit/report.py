"""The audit report of one `tcert-check` run: one self-contained HTML page, or Markdown.

`write(path, result, record, command)` is called by tcert-check after its verdict is decided: `result` is
the JSON object tcert-check prints with --json, `record` holds the Obligations record, the parsed
certificate and the loaded model (either may be None when the check ended early), `command` the argv that
re-runs the check. The page holds: the verdict (a REJECTED page names the failing obligation and its
numbers, an ERROR page the error); the statement; the model file's name, SHA-256, architecture, parameter
count and provenance; the claim as a table; every obligation in order with its certified figures and time;
plots where they help (overwhelm: W against PTP/2 and per-head figures; accuracy: inputs covered per max
token; every check: time per obligation); backend, precision, versions and the command.

Everything a certificate says is untrusted text: the HTML escapes all of it, and the page forbids scripts
and every network load (Content-Security-Policy), so a hostile certificate cannot run code in the browser
that opens its report. Nothing here can change a verdict.
"""

import html
import os
import shlex
from fractions import Fraction

from tcert.audit import describe, plots
from tcert.checker.numbers import parse_number, show

MAX_CELL = 400          # characters of one table cell (long token lists are cut, with a note)
MAX_LIST = 24           # entries of a list figure shown in a cell


def write(path: str, result: dict, record: dict, command: list) -> None:
    """Write the report of one check to `path`: HTML for .html/.htm, Markdown for .md."""
    facts = gather(result, record, command)
    text = markdown(facts) if path.lower().endswith(".md") else page(facts)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# --- what the report says ------------------------------------------------------------------------------

def gather(result: dict, record: dict, command: list) -> dict:
    """Everything the report shows, as plain values (both renderings read this)."""
    ob, cert, model = record.get("obligations"), record.get("certificate"), record.get("model")
    facts = {"verdict": result.get("verdict", "ERROR"), "result": result, "command": shlex.join(command),
             "certificate_file": result.get("certificate"), "kind": result.get("kind", "(unknown)"),
             "obligations": list(ob.done) if ob is not None else [], "failed": None}
    if facts["verdict"] == "REJECTED":
        facts["failed"] = (result.get("obligation", ""), result.get("detail", ""))
    facts["statement"] = statement(ob, cert, model)
    facts["model"] = model_facts(result, cert, model)
    facts["claim"] = flatten(cert["claim"]) if isinstance(cert, dict) and isinstance(cert.get("claim"), dict) else []
    facts["evidence"] = evidence_summary(cert)
    facts["informational"] = informational(cert)
    facts["plots"] = plots.for_check(facts["kind"], facts["obligations"], cert, model, facts["verdict"])
    return facts


def statement(ob, cert, model) -> tuple:
    """(text, where it comes from) for the report's statement."""
    if ob is not None and ob.statement:
        said = cert.get("statement") if isinstance(cert, dict) else None
        note = ("the certificate's statement is exactly this text (checked)" if said is not None else
                "the certificate carries no statement; this is the checker's text for its claim")
        return ob.statement, note
    if isinstance(cert, dict) and model is not None:
        try:
            from tcert.checker.statement import statement_for
            return statement_for(cert["kind"], cert["claim"], model), \
                "written from the claim by the checker's statement module; the check did not confirm it"
        except Exception:   # a claim the kind refused may not have the shape the words need
            pass
    if isinstance(cert, dict) and isinstance(cert.get("statement"), str):
        return cert["statement"], "as written in the certificate; NOT confirmed by the check"
    return "(no statement: the certificate could not be read)", ""


def model_facts(result: dict, cert, model) -> list:
    """(label, value) rows about the model file."""
    certified = cert.get("model_sha256") if isinstance(cert, dict) else None
    rows = [("model file", os.path.basename(result.get("model") or "") or "(none)")]
    if model is None:
        rows.append(("SHA-256", "(the model file could not be read)"))
    else:
        rows.append(("SHA-256", model.sha256))
    if certified is not None:
        same = model is not None and certified == model.sha256
        rows.append(("certified SHA-256", f"{certified} ({'the same file' if same else 'NOT this file'})"))
    if model is not None:
        rows += [("architecture", describe.architecture(model.config)),
                 ("parameters", f"{describe.parameter_count(model):,}"),
                 ("provenance", provenance_text(describe.provenance(model)))]
    return rows


def provenance_text(p) -> str:
    """The model file's recorded provenance in one line."""
    if p is None:
        return "none recorded (the file was not written by `tcert model import` with provenance)"
    parts = [f"{k} {v}" for k, v in sorted(p.items()) if k not in ("files", "config")]
    if isinstance(p.get("config"), dict):
        parts.append(f"config {p['config'].get('source')} sha256 {p['config'].get('sha256')}")
    if isinstance(p.get("files"), dict):
        parts.append("files: " + ", ".join(f"{n} sha256 {h}" for n, h in p["files"].items()))
    return "; ".join(parts)


def flatten(obj, path: str = "claim") -> list:
    """(JSON path, value text) rows of a claim: objects opened, lists of scalars kept on one row."""
    if isinstance(obj, dict):
        return [row for k in sorted(obj) for row in flatten(obj[k], f"{path}.{k}")]
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return [row for i, v in enumerate(obj) for row in flatten(v, f"{path}[{i}]")]
    return [(path, value_text(obj))]


def value_text(value) -> str:
    """A claim value as text: exact numbers with a decimal beside them, lists of token ids as they are."""
    if isinstance(value, list):
        text = "[" + ", ".join(value_text(v) for v in value) + "]"
        return text if len(text) <= MAX_CELL else text[:MAX_CELL] + f" ... ({len(value)} entries)"
    if isinstance(value, str):
        try:
            q = parse_number(value, "claim")
        except Exception:
            return value[:MAX_CELL]
        return value if q.denominator == 1 else f"{value[:MAX_CELL]} (~{show(q)})"
    return str(value)[:MAX_CELL]


def figure_text(value) -> str:
    """A certified figure as text (show() for numbers: the checker's one safe formatter)."""
    if isinstance(value, (list, tuple)):
        head = ", ".join(figure_text(v) for v in value[:MAX_LIST])
        return f"[{head}{', ...' if len(value) > MAX_LIST else ''}]" + (
            f" ({len(value)} entries)" if len(value) > MAX_LIST else "")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {figure_text(v)}" for k, v in list(value.items())[:MAX_LIST]) + "}"
    if isinstance(value, (int, Fraction)) and not isinstance(value, bool):
        return show(value)
    return str(value)[:MAX_CELL]


def evidence_summary(cert) -> list:
    """(field, what it holds) rows: the evidence is large, so the report says its shape, not its numbers."""
    ev = cert.get("evidence") if isinstance(cert, dict) else None
    if not isinstance(ev, dict):
        return []
    rows = []
    for k in sorted(ev):
        v = ev[k]
        rows.append((f"evidence.{k}", f"{len(v)} entries" if isinstance(v, list) else
                     f"object with {len(v)} fields" if isinstance(v, dict) else value_text(v)))
    return rows


def informational(cert) -> list:
    """(field, value) rows of the certificate's informational sections (read by no rule)."""
    rows = []
    for section in ("model", "generator"):
        part = cert.get(section) if isinstance(cert, dict) else None
        if isinstance(part, dict):
            for k in sorted(part):
                v = part[k]
                v = shlex.join(map(str, v)) if k == "command" and isinstance(v, list) else v
                rows.append((f"{section}.{k}", str(getattr(v, "text", v))[:MAX_CELL]))
    return rows


def environment(facts: dict) -> list:
    """(label, value) rows: how the check ran and how to run it again."""
    r = facts["result"]
    versions = r.get("versions", {})
    rows = [("certificate file", facts["certificate_file"]), ("backend", r.get("backend")),
            ("precision", f"{r.get('prec')} bits"),
            ("seconds", str(r.get("seconds")))]
    if "prec_hint" in r:
        h = r["prec_hint"]
        rows.append(("higher precision", f"re-checked at --prec {h['prec']}: {h['verdict']}"))
    rows += [(name, v) for name, v in versions.items()]
    rows.append(("re-run", facts["command"]))
    return rows


# --- HTML ---------------------------------------------------------------------------------------------

STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#1d1d1f;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:.4em 0}td,th{border:1px solid #ddd;padding:.3em .5em;
text-align:left;vertical-align:top}th{background:#f5f5f7}code,td.mono{font-family:ui-monospace,monospace;
font-size:.9em;word-break:break-all}.verdict{font-size:1.3em;font-weight:700;padding:.6em 1em;border-radius:6px}
.VERIFIED{background:#e3f5e1;color:#155724}.REJECTED{background:#fbe3e4;color:#8a1f1f}
.ERROR,.INTERNAL{background:#fff3cd;color:#7a5200}tr.failed td{background:#fbe3e4}
.statement{background:#f5f5f7;padding:.8em 1em;border-left:4px solid #888}.note{color:#666;font-size:.9em}
figure{display:inline-block;margin:.5em 1em .5em 0}figcaption{font-size:.85em;color:#444}td code{font-size:1em}"""


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def rows_html(rows: list, mono: bool = False) -> str:
    cls = ' class="mono"' if mono else ""
    return "".join(f"<tr><th>{esc(a)}</th><td{cls}>{esc(b)}</td></tr>" for a, b in rows)


def obligations_html(facts: dict) -> str:
    """One <tr class="obligation"> per obligation checked, in order; the failing one last, in red."""
    out = ['<table id="obligations"><tr><th>#</th><th>obligation</th><th>certified figures</th>'
           '<th>seconds</th></tr>']
    for i, o in enumerate(facts["obligations"], 1):
        figs = "<br>".join(f"<code>{esc(k)}</code> = {esc(figure_text(v))}" for k, v in o.figures.items()
                           if k != "statement")
        out.append(f'<tr class="obligation"><td>{i}</td><td>{esc(o.name)}</td><td>{figs}</td>'
                   f"<td>{o.seconds:.4f}</td></tr>")
    if facts["failed"]:
        name, detail = facts["failed"]
        out.append(f'<tr class="obligation failed"><td>{len(facts["obligations"]) + 1}</td><td>{esc(name)}</td>'
                   f"<td>FAILED: {esc(detail)}</td><td></td></tr>")
    return "".join(out) + "</table>"


def banner(facts: dict) -> str:
    """The verdict, and for REJECTED / ERROR what went wrong."""
    v, r = facts["verdict"], facts["result"]
    text = {"VERIFIED": f"VERIFIED: {r.get('summary', '')}",
            "REJECTED": f"REJECTED: {r.get('obligation', '')}: {r.get('detail', '')}"}.get(v, f"{v}: {r.get('error', '')}")
    cls = v.split()[0]
    return f'<div id="verdict" class="verdict {esc(cls)}">{esc(text)}</div>'


def page(facts: dict) -> str:
    """The report as one self-contained HTML page."""
    st, note = facts["statement"]
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:\">",
        f"<title>tcert audit report: {esc(facts['verdict'])} ({esc(facts['kind'])})</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>tcert audit report: {esc(facts['kind'])} certificate "
        f"<code>{esc(os.path.basename(facts['certificate_file'] or ''))}</code></h1>",
        banner(facts),
        f'<h2>Statement</h2><p id="statement" class="statement">{esc(st)}</p><p class="note">{esc(note)}</p>',
        f'<h2>Model</h2><table id="model">{rows_html(facts["model"], True)}</table>',
        f'<h2>Claim</h2><table id="claim">{rows_html(facts["claim"], True)}</table>',
        f"<h2>Obligations, in the order checked</h2>{obligations_html(facts)}",
    ]
    if facts["plots"]:
        parts.append("<h2>Plots</h2>" + "".join(f"<figure>{svg}<figcaption>{esc(cap)}</figcaption></figure>"
                                                for cap, svg in facts["plots"]))
    parts += [f'<h2>How the check ran</h2><table id="environment">{rows_html(environment(facts), True)}</table>',
              f'<h2>Evidence (shape only)</h2><table>{rows_html(facts["evidence"], True)}</table>',
              '<h2>Informational (read by no rule, not checked)</h2>'
              f'<table id="informational">{rows_html(facts["informational"], True)}</table>',
              "</body></html>\n"]
    return "\n".join(parts)


# --- Markdown -----------------------------------------------------------------------------------------

def md_cell(text) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def md_table(rows: list, head=("field", "value")) -> list:
    return [f"| {' | '.join(head)} |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]


def markdown(facts: dict) -> str:
    """The report as Markdown (the same facts; no plots)."""
    st, note = facts["statement"]
    r = facts["result"]
    verdict = {"VERIFIED": f"**VERIFIED**: {r.get('summary', '')}",
               "REJECTED": f"**REJECTED**: {r.get('obligation', '')}: {r.get('detail', '')}"}.get(
        facts["verdict"], f"**{facts['verdict']}**: {r.get('error', '')}")
    obl = [(str(i), o.name, "; ".join(f"{k} = {figure_text(v)}" for k, v in o.figures.items() if k != "statement"),
            f"{o.seconds:.4f}") for i, o in enumerate(facts["obligations"], 1)]
    if facts["failed"]:
        obl.append((str(len(obl) + 1), facts["failed"][0], "FAILED: " + facts["failed"][1], ""))
    name = os.path.basename(facts["certificate_file"] or "")
    lines = [f"# tcert audit report: {md_cell(facts['kind'])} certificate `{md_cell(name)}`", "",
             md_cell(verdict), "", "## Statement", "", "> " + md_cell(st), "", f"*{md_cell(note)}*", "",
             "## Model", "", *md_table(facts["model"]), "", "## Claim", "", *md_table(facts["claim"]), "",
             "## Obligations, in the order checked", "",
             *md_table(obl, ("#", "obligation", "certified figures", "seconds")), "",
             "## How the check ran", "", *md_table(environment(facts)), "",
             "## Evidence (shape only)", "", *md_table(facts["evidence"]), "",
             "## Informational (read by no rule, not checked)", "", *md_table(facts["informational"]), ""]
    return "\n".join(lines)
