"""`tcert model import` records where a model came from: the source's name, format and SHA-256, in the
model file's metadata (bound by the model's SHA-256); certificates copy it as information."""

import hashlib
import json
import shutil
import subprocess

import numpy as np
import pytest

from tcert.checker.modelfile import load_model
from tcert.generator.cli import main as tcert
from tcert.testing import CERTIFICATES

ANCHOR = CERTIFICATES / "anchors" / "maxofk" / "maxof4_seed50.npz"


def provenance(path):
    return json.loads(load_model(str(path)).metadata["provenance"])


def test_npz_import_records_its_source(tmp_path, capsys):
    src = tmp_path / "maxof4_seed50.npz"
    shutil.copy(ANCHOR, src)
    out = tmp_path / "m.safetensors"
    assert tcert(["model", "import", str(src), "--out", str(out)]) == 0
    p = provenance(out)
    assert p == {"source": "maxof4_seed50.npz", "format": "npz", "tool": "tcert model import",
                 "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}
    assert str(tmp_path) not in json.dumps(p)         # the name only, not the folders above it
    assert tcert(["predict", "--model", str(out), "--tokens", "3,17,5,60", "--out", str(tmp_path / "c.json")]) == 0
    capsys.readouterr()
    cert = json.loads((tmp_path / "c.json").read_text())
    assert cert["model"]["provenance"] == p and cert["model"]["file"] == "m.safetensors"


def test_safetensors_import_records_its_config_too(tmp_path, capsys):
    from safetensors.numpy import save_file
    m = load_model(str(CERTIFICATES / "models" / "maxof4_seed123.safetensors"))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in m.tensors.items()}, str(tmp_path / "w.safetensors"))
    (tmp_path / "cfg.json").write_text(m.metadata["config"])
    out = tmp_path / "m.safetensors"
    assert tcert(["model", "import", str(tmp_path / "w.safetensors"), "--config", str(tmp_path / "cfg.json"),
                  "--out", str(out)]) == 0
    p = provenance(out)
    assert p["format"] == "safetensors" and p["sha256"] == hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    assert p["config"] == {"source": "cfg.json", "sha256": hashlib.sha256((tmp_path / "cfg.json").read_bytes()).hexdigest()}


def test_checkpoint_folder_provenance_is_what_sha256sum_says(tmp_path, capsys):
    """A real GPT-NeoX checkpoint folder (transformers' save_pretrained): per-file SHA-256 and the folder's
    digest, each equal to what the documented `sha256sum` command prints."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(vocab_size=20, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                     num_hidden_layers=1, max_position_embeddings=8, rotary_pct=0.5)
    folder = tmp_path / "pythia-tiny"
    transformers.GPTNeoXForCausalLM(cfg).save_pretrained(str(folder), safe_serialization=True)
    out = tmp_path / "m.safetensors"
    assert tcert(["model", "import", str(folder), "--out", str(out)]) == 0
    capsys.readouterr()
    p = provenance(out)
    assert p["source"] == "pythia-tiny" and p["format"] == "checkpoint folder (Hugging Face model_type gpt_neox)"
    listing = subprocess.run("sha256sum $(LC_ALL=C ls -p | grep -v /)", shell=True, cwd=folder, check=True,
                             capture_output=True, text=True).stdout
    assert {n: h for h, n in (line.split("  ") for line in listing.splitlines())} == p["files"]
    assert hashlib.sha256(listing.encode()).hexdigest() == p["sha256"]
    assert {"config.json", "model.safetensors"} <= set(p["files"])
