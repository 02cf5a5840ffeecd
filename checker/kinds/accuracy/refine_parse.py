"""`accuracy` by refinement: reading the evidence (refine.py's module docstring states its fields).

`parse_mixed` and `parse_patterns` turn evidence.mixed and evidence.patterns into the cases' entries, each
entry first by a one-line test of every field and, where it fails, by `mixed_fields` / `pattern_fields`, which
name the field at fault; `parse_unclaimed` reads the rule "e" entries' unclaimed hints. Everything here is
BadInput (exit 2) on a malformed entry or one beyond a limit; nothing here is an obligation.
"""

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy import cubic
from tcert.checker.kinds.accuracy.cases import case_name
from tcert.checker.numbers import parse_int, show

MAX_PATTERN_POSITIONS = 3     # a pattern's decoupled count enumerates m^(c-1) partial fillings
MAX_PATTERN_WORK = 1 << 26    # sum over pattern entries of m^c: the inputs rule "e" may enumerate
MAX_UNCLAIMED_DIGITS = 1 << 24    # hex digits in all unclaimed hints: parse_unclaimed holds ~16 bytes per digit


def parse_mixed(entries, n: int, v: int) -> dict:
    """evidence.mixed as {(m, q, c): [(S, b), ...]}: two entries of one case with the same b have disjoint
    sets (entries with different b cover disjoint inputs anyway: every token outside K is in the entry's set,
    and there are exactly b of them; S disjoint from the case's cubic set K is an obligation, `mixed_weight`)."""
    if not isinstance(entries, list) or len(entries) > v * v * n * v:
        raise BadInput(f"evidence.mixed: must be a list of at most {v * v * n * v} entries")
    out, masks = {}, {}                                   # masks: each (hexmask, m) read once
    for j, entry in enumerate(entries):
        where = lambda: f"evidence.mixed[{j}]"
        if not (type(entry) is list and len(entry) == 5 and type(entry[0]) is type(entry[1]) is type(entry[2])
                is type(entry[4]) is int and 0 <= entry[1] <= entry[0] < v and entry[0] and 1 <= entry[4] <= entry[2]
                <= (n - 1 if entry[1] == entry[0] else n - 2)):     # else the field at fault, named:
            mixed_fields(entry, where(), n, v)
        m, q, c, b = entry[0], entry[1], entry[2], entry[4]
        S = masks.get((entry[3], m)) if type(entry[3]) is str else None
        if S is None:                                     # a non-empty subset of [0, m) (a non-string: refused)
            S = masks[entry[3], m] = cubic.parse_mask(entry[3], where(), v, m, 1)
        for S2, b2 in out.get((m, q, c), []):
            if b2 == b and set(S) & set(S2):
                raise BadInput(f"{where()}: overlaps another mixed entry of {case_name(m, q, c)}")
        out.setdefault((m, q, c), []).append((S, b))
    return out


def mixed_fields(entry, where: str, n: int, v: int):
    """Raise BadInput naming the first field of a mixed entry that is malformed or out of range (m in [1, v-1],
    q in [0, m], c in [1, n-1] when q = m else [1, n-2], the mask, b in [1, c]); `parse_mixed` calls it on an
    entry its one-line test of the same conditions refuses."""
    if not isinstance(entry, list) or len(entry) != 5:
        raise BadInput(f"{where}: must be [m, q, c, hexmask, b]")
    m = parse_int(entry[0], where + ".m", 1, v - 1)
    q = parse_int(entry[1], where + ".q", 0, m)
    c = parse_int(entry[2], where + ".c", 1, n - 1 if q == m else n - 2)
    cubic.parse_mask(entry[3], where, v, m, 1)
    parse_int(entry[4], where + ".b", 1, c)


def parse_patterns(entries, mixed: dict, n: int, v: int) -> dict:
    """evidence.patterns as {(m, q, P): rule} (P a tuple of positions), within the limits."""
    if not isinstance(entries, list) or len(entries) > v * v * (1 << (n - 1)):
        raise BadInput(f"evidence.patterns: must be a list of at most {v * v * (1 << (n - 1))} entries")
    shapes = [tuple(i for i in range(n - 1) if mask >> i & 1) for mask in range(1 << (n - 1))]
    out, work, hints = {}, 0, []
    for j, entry in enumerate(entries):
        if not (type(entry) is list and (len(entry), entry[3:4]) in ((4, ["d"]), (5, ["e"])) and type(entry[0])
                is type(entry[1]) is type(entry[2]) is int and 0 <= entry[1] <= entry[0] < v and 0 <= entry[2] < len(shapes)):
            pattern_fields(entry, f"evidence.patterns[{j}]", n, v)     # else the field at fault, named
        m, q, P = entry[0], entry[1], shapes[entry[2]]
        if (q < m and len(P) == n - 1) or (m == 0 and P) or len(P) > MAX_PATTERN_POSITIONS:
            raise BadInput(f"evidence.patterns[{j}]: no such position pattern (at most {MAX_PATTERN_POSITIONS} "
                           f"positions, one holding m when q < m)")
        if (m, q, len(P)) in mixed or (m, q, P) in out:
            raise BadInput(f"evidence.patterns[{j}]: {case_name(m, q, len(P))} is split twice")
        work += m ** len(P)
        out[(m, q, P)] = (entry[3], None)
        if entry[3] == "e":
            hints.append((entry[4], f"evidence.patterns[{j}].unclaimed", m, len(P), (m, q, P)))
    if work > MAX_PATTERN_WORK:
        raise BadInput(f"evidence.patterns: {show(work)} inputs in the pattern groups exceed {MAX_PATTERN_WORK}")
    for (*_, key), fillings in zip(hints, parse_unclaimed(hints, v)):
        out[key] = ("e", fillings)
    return out


def pattern_fields(entry, where: str, n: int, v: int):
    """Raise BadInput naming the first field of a pattern entry that is malformed or out of range (the shape
    [m, q, posmask, "d"] or [m, q, posmask, "e", unclaimed], m in [0, v-1], q in [0, m], posmask in
    [0, 2^(n-1) - 1]); `parse_patterns` calls it on an entry its one-line test of the same conditions refuses."""
    if not isinstance(entry, list) or (len(entry), entry[3:4]) not in ((4, ["d"]), (5, ["e"])):
        raise BadInput(f"{where}: must be [m, q, posmask, \"d\"] or [m, q, posmask, \"e\", unclaimed]")
    m = parse_int(entry[0], where + ".m", 0, v - 1)
    parse_int(entry[1], where + ".q", 0, m)
    parse_int(entry[2], where + ".posmask", 0, (1 << (n - 1)) - 1)


NIBBLE = np.full(256, 16, dtype=np.uint8)      # a lowercase hex digit's value; 16 marks any other byte
NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)


def parse_unclaimed(hints, v: int) -> list:
    """Rule "e" entries' unclaimed fillings, hints [(text, where, m, k, ...), ...], as (N, k) arrays of tokens
    below m: each text a lowercase hex string of N * k tokens, each written with as many digits as
    d_vocab - 1 needs (2 for d_vocab 64), position by position ("" for none; at most m^k fillings). All
    texts are read in one pass."""
    w = len(format(v - 1, "x"))
    for text, where, m, k, *_ in hints:
        if not isinstance(text, str) or len(text) % max(w * k, 1) or len(text) > w * k * m ** k:
            raise BadInput(f"{where}: must be a hex string of fillings, {k} tokens of {w} digits each")
    if sum(len(h[0]) for h in hints) > MAX_UNCLAIMED_DIGITS:
        raise BadInput(f"evidence.patterns: the unclaimed hints exceed {MAX_UNCLAIMED_DIGITS} hex digits")
    digit = lambda text: NIBBLE[np.frombuffer(text.encode(), np.uint8)]    # non-ASCII: bytes >= 128, all 16
    digits = digit("".join(h[0] for h in hints))
    if np.any(digits == 16):
        raise BadInput(f"{next(h[1] for h in hints if np.any(digit(h[0]) == 16))}: must be a lowercase hex string")
    tokens = digits.reshape(-1, w).astype(np.int64) @ (16 ** np.arange(w - 1, -1, -1))
    counts = [len(h[0]) // w for h in hints]
    ends = np.cumsum(counts, dtype=np.int64)
    above = np.nonzero(tokens >= np.repeat(np.array([h[2] for h in hints], dtype=np.int64), counts))[0]
    if len(above):
        _, where, m, *_ = hints[int(np.searchsorted(ends, above[0], side="right"))]
        raise BadInput(f"{where}: a token is not below the group's max token m = {m}")
    return [tokens[e - c:e].reshape(c // h[3] if h[3] else 0, h[3]) for c, e, h in zip(counts, ends.tolist(), hints)]
