"""The one place where the experiments call into the certificate families, training and the checker.

Other areas rename their internals freely; the experiments only go through these functions, so a renamed
entry point is a one-line fix here. Imports are lazy: a Dask worker pays only for what its cell uses.
"""


# --------------------------------------------------------------------------------------------- checker

def verify(certificate, model, backend):
    """The checker (`tcert.checker.verify.verify`): returns Obligations, raises Rejected / BadInput."""
    from tcert.checker.verify import verify as check
    return check(certificate, model, backend)


def checker_errors():
    """(Rejected, BadInput): the two ways a check ends without VERIFIED."""
    from tcert.checker.errors import BadInput, Rejected
    return Rejected, BadInput


def load_model(path):
    from tcert.checker.modelfile import load_model as load
    return load(path)


def parse_model_bytes(data):
    from tcert.checker.modelfile import parse_model_bytes as parse
    return parse(data)


def certificate_text(cert) -> str:
    """The deterministic JSON text of a certificate (what `tcert` writes to a file)."""
    from tcert.generator.certificate import dumps
    return dumps(cert)


def logits(model, tokens):
    """Float64 logits of a batch of token rows (the generator's forward pass)."""
    from tcert.generator.model.forward import logits as forward
    return forward(model, tokens)


# -------------------------------------------------------------------------------------------- overwhelm

def overwhelm_generate(model, prefix, query, free_spec, method):
    """(certificate or None, report) of the naive / lp method."""
    from tcert.generator.overwhelm.naive_lp import generate
    return generate(model, prefix, query, free_spec, method)


def overwhelm_generate_tight(model, prefix, query, free_spec):
    """(certificate or None, report) of the tight method."""
    from tcert.generator.overwhelm.tight import generate_tight
    return generate_tight(model, prefix, query, free_spec)


def overwhelm_float_tables(model, prefix, query, n_free):
    """The float64 tables of the naive bound (free mass S, lq, values, alpha_fix) and the float weights
    (WO per head, WU), for the appendix-F closed form."""
    from tcert.generator.overwhelm.naive_lp import FloatModel, float_tables
    fm = FloatModel(model)
    return float_tables(fm, prefix, query, list(range(model.config.d_vocab)), n_free), fm.WO, fm.WU


# --------------------------------------------------------------------------------------------- accuracy

def accuracy_certificate(model, strategy):
    """(certificate, report) of one Max-of-K strategy: brute | cubic | subcubic[:NAME] | refine[:BUDGET]."""
    from tcert.generator.accuracy.strategies import make_certificate
    return make_certificate(model, strategy, None)


def accuracy_strategy_error(strategy):
    """None if `tcert accuracy --strategy` accepts `strategy`, else the reason."""
    kind, _, name = strategy.partition(":")
    if kind in ("brute", "cubic") and not name:
        return None
    if kind not in ("subcubic", "refine"):
        return f"unknown strategy {strategy!r} (brute, cubic, subcubic[:NAME], refine[:BUDGET])"
    from tcert.generator.accuracy.refine import parse_budget
    from tcert.generator.accuracy.subcubic import parse_name
    try:
        (parse_name if kind == "subcubic" else parse_budget)(name or None)
    except ValueError as e:
        return str(e)
    return None


def accuracy_estimate(model, samples, seed=0):
    from tcert.generator.accuracy.strategies import estimate_accuracy
    return estimate_accuracy(model, samples, seed)


# ------------------------------------------------------------------------------------------ text models

def model_tokenizer(model_path, tokenizer_name):
    """The tokenizer a text model names (its vocabulary file beside the model)."""
    from tcert.generator.train.text_data import model_tokenizer as tokenizer
    return tokenizer(model_path, tokenizer_name)


def encode(tok, text):
    """Token ids of `text`."""
    from tcert.generator.train.text_data import encode as enc
    return enc(tok, text)


def held_out_sentences(corpus):
    """The held-out sentences of a training corpus."""
    from tcert.generator.train.text_data import held_out_sentences as held_out
    return held_out(corpus)


# --------------------------------------------------------------------------------------------- training

def train_maxofk(k, seed, d_vocab, steps):
    """(tensors, config, loss history) of the reference Max-of-K recipe."""
    from tcert.generator.train.maxofk import train_maxofk as train
    return train(k=k, seed=seed, d_vocab=d_vocab, steps=steps, progress=False)


def save_model(path, tensors, config):
    from tcert.generator.model.files import save_model as save
    return save(path, tensors, config)


def import_npz(path):
    """(tensors, config) of a TransformerLens state_dict stored as .npz (the shipped Max-of-K anchors)."""
    from tcert.generator.model.importers import import_npz as imp
    return imp(path)
