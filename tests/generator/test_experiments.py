"""`tcert experiment overwhelm-paper` on the shipped text model: cells, certificates, resume, outputs."""

import json

import pytest

from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES
from tcert.generator.train import text_data
from tcert.generator.cli import main
from tcert.generator.experiments.overwhelm_paper import FIXED_KINDS, fixed_tokens

SMALL = CERTIFICATES / "models" / "text_small.safetensors"


@pytest.fixture(scope="module")
def tok():
    m = load_model(str(SMALL))
    return text_data.model_tokenizer(str(SMALL), m.config.tokenizer_name)


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
    cert = json.loads((out / cell["certificate"]).read_text())  # paths in a run folder are relative to it
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


def test_tight_cells_in_the_sweep(tmp_path):
    """Method tight per cell: its W analogue (PTP + b)/2 is below PTP/2 exactly when its bound b < 0, it is
    never above naive's W on these cells, and its certificates are checked by tcert-check."""
    out = tmp_path / "run"
    argv = ["experiment", "overwhelm-paper", "--model", str(SMALL), "--out-dir", str(out), "--lengths", "1500",
            "--samples", "1", "--free", "blotches", "--methods", "naive,tight", "--generate", "0", "--jobs", "1",
            "--corpus", "lee"]
    assert main(argv) == 0
    rows = {r["id"]: r for r in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    assert len(rows) == 3 * 2
    for r in rows.values():
        if r["method"] == "tight":
            assert (r["W"] < r["ptp"] / 2) == (r["tight_bound"] < 0) == (r["verdict"] == "Overwhelmed")
            assert abs(2 * r["W"] - r["ptp"] - r["tight_bound"]) < 1e-9
            assert r["W"] <= rows[r["id"].replace("-tight", "-naive")]["W"] * (1 + 1e-9)
    cell = rows["blotches-whatisit-s0-n1500-tight"]
    assert cell["verdict"] == "Overwhelmed" and cell["checked"] == "VERIFIED"
    assert json.loads((out / cell["certificate"]).read_text())["evidence"]["method"] == "tight"
    assert "tight_bound" in (out / "points.csv").read_text().splitlines()[0]


def test_repetition_experiment_on_a_tiny_nope_model(tmp_path):
    """Appendix F: on a model without positions, W (naive) follows the predicted closed form in n_fix,
    PTP does not depend on n_fix, W falls at rate 1/n, and the certified cells are VERIFIED."""
    from tcert.generator.model.files import save_model
    from tcert.testing.overwhelm import tiny_neox1l
    tensors, cfg = tiny_neox1l(seed=11, d_vocab=5, qk_scale=0.3, n_ctx=2048)
    cfg = dict(cfg, positional_embedding_type="none")
    cfg.pop("rotary_dim")
    model = tmp_path / "nope.safetensors"
    save_model(str(model), tensors, cfg)
    out = tmp_path / "rep"
    argv = ["experiment", "overwhelm-repetition", "--model", str(model), "--out-dir", str(out), "--tokens", "0 3",
            "--n-free", "2", "--lengths", "1,10,100,1000,2045", "--jobs", "1"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 5 * 2
    summary = json.loads((out / "summary.json").read_text())
    for label, s in summary.items():
        mine = sorted((r for r in rows if r["repeated"] == s["token"]), key=lambda r: (r["method"], r["n_fix"]))
        assert s["ptp_range"][1] - s["ptp_range"][0] < 1e-9 * s["ptp"]
        assert s["max_rel_gap_measured_vs_predicted_naive"] < 1e-6
        assert abs(s["fitted_slope_naive"] + 1) < 0.05
        assert s["alpha_fix_at_n1"] == [2.0] * cfg["n_heads"]
        naive = [r["W"] for r in mine if r["method"] == "naive"]
        assert all(b < a for a, b in zip(naive, naive[1:]))
        for r in mine:
            assert (r["verdict"] == "Overwhelmed") == (r["checked"] == "VERIFIED")
    assert any(r["verdict"] == "Overwhelmed" for r in rows)
    for name in ("points.csv", "fig_repetition.png"):
        assert (out / name).stat().st_size > 100
