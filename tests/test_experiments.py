"""`tcert experiment overwhelm-paper` on the shipped text model: cells, certificates, resume, outputs."""

import json

import pytest

from checker.modelfile import load_model
from conftest import CERTIFICATES
from generator import text_data
from generator.cli import main
from generator.experiments import FIXED_KINDS, fixed_tokens

SMALL = CERTIFICATES / "models" / "text_small.safetensors"


@pytest.fixture(scope="module")
def tok():
    m = load_model(str(SMALL))
    return text_data.model_tokenizer(str(SMALL), m.config.tokenizer)


def test_fixed_strings_are_deterministic_and_of_the_asked_length(tok):
    sentences = text_data.held_out_sentences("lee")
    for kind in FIXED_KINDS:
        a = fixed_tokens(tok, kind, 57, 0, sentences)
        assert len(a) == 57 and a == fixed_tokens(tok, kind, 57, 0, sentences)
        if kind != "whatisit":
            assert a != fixed_tokens(tok, kind, 57, 1, sentences)
    assert tok.decode(fixed_tokens(tok, "whatisit", 6, 0, sentences)) == "what is it what is it"


def test_sweep_certifies_resumes_and_writes_results(tmp_path):
    out = tmp_path / "run"
    argv = ["experiment", "overwhelm-paper", "--model", str(SMALL), "--out-dir", str(out), "--lengths", "10,1500",
            "--samples", "1", "--free", "blotches", "--methods", "naive,lp", "--generate", "1", "--jobs", "1",
            "--corpus", "lee", "--no-check"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 2
    by_id = {r["id"]: r for r in rows}
    for kind in ("alnum-s0", "heldout-s0", "whatisit-s0"):
        assert by_id[f"blotches-{kind}-n10-lp"]["W"] <= by_id[f"blotches-{kind}-n10-naive"]["W"] * (1 + 1e-9)
    # "what is it" repeated 500 times overwhelms the model for every order of the quote (LP, not naive).
    cell = by_id["blotches-whatisit-s0-n1500-lp"]
    assert cell["verdict"] == "Overwhelmed" and cell["W"] < cell["ptp"] / 2
    assert by_id["blotches-whatisit-s0-n1500-naive"]["verdict"] == "Inconclusive"
    cert = json.loads(open(cell["certificate"]).read())
    assert cert["claim"]["free"]["tokens"] == text_data.encode(text_data.model_tokenizer(str(SMALL), "text_small.vocab.txt"),
                                                               "The blotches ran well down the sides of his face")
    gen = [json.loads(line) for line in (out / "generation.jsonl").read_text().splitlines()]
    assert [g["n_fix"] for g in gen] == [1500, 1501]
    for name in ("points.csv", "fig2_deviation.png", "fig3_ptp.png", "fig4_generation.png"):
        assert (out / name).stat().st_size > 100
    assert len((out / "points.csv").read_text().splitlines()) == 1 + len(rows) + len(gen)
    # Resume: a rerun finds every cell done and computes nothing new; --check-limit 1 then checks the
    # certified cell with the largest n_fix with the checker.
    assert cell["checked"] is None
    assert main(argv + ["--check-limit", "1"]) == 0
    lines = (out / "cells.jsonl").read_text().splitlines()
    assert len(lines) == len(rows) + 1
    last = json.loads(lines[-1])
    assert last["n_fix"] == 1500 and last["verdict"] == "Overwhelmed" and last["checked"] == "VERIFIED"
    assert last["check_seconds"] > 0
    assert "VERIFIED" in (out / "points.csv").read_text()
    before = (out / "cells.jsonl").read_text()
    assert main(argv) == 0  # every cell done: nothing is computed or checked again
    assert (out / "cells.jsonl").read_text() == before
    assert len((out / "generation.jsonl").read_text().splitlines()) == 2
