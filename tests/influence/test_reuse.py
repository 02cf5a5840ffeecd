"""What the influence derivation computes once and reuses gives the numbers a fresh computation gives: the
embeddings' squares and sums (`norms.RowTerms`) shared by every LayerNorm map, the token norm and block 0's
value sets, and a parallel block's two LayerNorm maps reading one reach. Both backends, several blocks of
rows with a short last one; the whole certificate's constants equal those of the unshared route."""

import numpy as np
import pytest

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import blocks, certified_needs, norms
from tcert.checker.modelfile import load_model
from tcert.generator.influence.ledger import FillLedger
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_terms_equal_the_fresh_computation(monkeypatch, backend, dtype):
    """RowTerms' minimum per offset and maximum norm are exactly min_centred_norms' and max_row_dist's, on
    repeated calls too (the kept minimum), centred and not."""
    monkeypatch.setattr(norms, "VECTOR_ROWS", 5)
    B, rng = make_backend(backend), np.random.default_rng(3)
    arr = (rng.normal(size=(17, 6)) + 0.4).astype(dtype)
    terms = norms.RowTerms(B, arr)
    with B.precision():
        assert len(terms.blocks()) == 4 and terms.blocks()[-1][0].shape[0] == 2
        if dtype == np.float32:
            assert terms.max_norm() == norms.max_row_dist(B, arr)
        for seed in range(3):
            c = [B.num(float(x)) for x in np.random.default_rng(seed).normal(size=6)]
            for centred in (True, False):
                fresh = norms.min_centred_norms(B, arr, [c], centred)[0]
                assert terms.min_centred_norm(c, centred) == fresh
                assert terms.min_centred_norm(c, centred) == fresh      # kept
                assert 0 < fresh


class Fresh(norms.RowTerms):
    """The route before RowTerms: every use computes its squares, sums and minimum again."""

    def blocks(self):
        self._blocks = None
        return super().blocks()

    def max_norm(self):
        return norms.max_row_dist(self.B, self.arr)

    def min_centred_norm(self, offset, centred):
        return norms.min_centred_norms(self.B, self.arr, [offset], centred)[0]


def needs(model, monkeypatch, shared: bool):
    """The generator's constants (FillLedger) with the RowTerms shared, or computed afresh at every use."""
    ld = FillLedger()
    with monkeypatch.context() as m:
        if not shared:
            m.setattr(blocks, "RowTerms", Fresh)
        certified_needs(model, make_backend("flint"), ld, 16, 2)
    return ld.claimed


@pytest.mark.parametrize("arch,extra", [("neox1l", {}), ("neox1l", {"shared_ln": False}), ("preln", {}), ("llama", {})])
def test_shared_terms_give_the_same_constants(tmp_path, monkeypatch, arch, extra):
    """Every constant of a 2-layer model (parallel residual with one or two LayerNorms, sequential; LayerNorm or
    RMSNorm; rotary) is the same with the shared RowTerms as with each LayerNorm map computing its own minimum;
    the blockwise value sets (block 0 reads RowTerms' squares and sums) too. A parallel block's two LayerNorm
    maps read one minimum: one minimum per distinct reach."""
    from tcert.checker.kinds.influence import vocabulary
    monkeypatch.setattr(norms, "VECTOR_ROWS", 7)
    monkeypatch.setattr(vocabulary, "VOCAB_ROWS", 7)
    monkeypatch.setattr(vocabulary, "TABLE_ENTRIES", 0)
    tensors, config = random_model(arch, d_vocab=23, d_model=12, n_heads=2, d_head=4, d_mlp=16, n_layers=2,
                                   bias_std=0.3, seed=9, n_ctx=16, **extra)
    path = str(tmp_path / "m.safetensors")
    save_model(path, tensors, config)
    model = load_model(path)
    calls, real = [], norms.centred_minima
    monkeypatch.setattr(norms, "centred_minima", lambda *a: calls.append(1) or real(*a))
    shared = needs(model, monkeypatch, True)
    minima, calls[:] = len(calls), []
    own = needs(model, monkeypatch, False)
    cfg = model.config
    maps = sum(1 for name in shared if name.endswith(".lip") and ".ln" in name or name == "ln_final.lip")
    distinct = 2 * (1 if cfg.parallel_attn_mlp else 2) + cfg.final_ln     # reaches the LayerNorm maps read
    assert shared == own and minima == distinct and len(calls) == maps
    assert maps == 2 * (1 + (not cfg.shared_ln)) + cfg.final_ln
