"""`tcert train maxofk`: deterministic, learns the task, and the saved file means what torch computed."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tcert.checker.modelfile import load_model  # noqa: E402
from tcert.generator.model import forward  # noqa: E402
from tcert.generator.model.files import save_model  # noqa: E402
from tcert.generator.train.maxofk import _forward, train_maxofk  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "m.safetensors"
    tensors, cfg, history = train_maxofk(k=3, seed=5, d_vocab=8, d_model=16, steps=400, progress=False)
    save_model(str(path), tensors, cfg)
    return path, tensors, history


def test_training_is_deterministic(trained, tmp_path):
    path, _, _ = trained
    again = tmp_path / "again.safetensors"
    tensors, cfg, _ = train_maxofk(k=3, seed=5, d_vocab=8, d_model=16, steps=400, progress=False)
    save_model(str(again), tensors, cfg)
    assert again.read_bytes() == path.read_bytes()


def test_training_learns_max_of_k(trained):
    path, _, history = trained
    model = load_model(str(path))
    inputs = np.array(list(itertools.product(range(8), repeat=3)))
    accuracy = (forward.logits(model, inputs).argmax(axis=1) == inputs.max(axis=1)).mean()
    assert np.mean(history[-50:]) < 0.5 * history[0]
    assert accuracy > 0.9, accuracy


def test_saved_model_matches_torch_forward(trained):
    path, tensors, _ = trained
    model = load_model(str(path))
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in tensors.items()}
    x = torch.tensor(list(itertools.product(range(8), repeat=3)))
    mask = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    expected = _forward(torch, params, x, mask, 16).numpy()
    got = forward.logits(model, x.numpy())
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-9)
