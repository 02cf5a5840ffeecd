"""The overwhelm claim as the generator writes it, and the `--free` specifications it is built from."""

from tcert.checker.errors import BadInput


def parse_free(spec: str):
    """"any:N" -> ("any", N, None); "perm:3,5,5" -> ("perm", 3, [3, 5, 5])."""
    kind, _, rest = spec.partition(":")
    try:
        if kind == "any":
            return "any", int(rest), None
        if kind == "perm":
            toks = [int(t) for t in rest.replace(" ", "").split(",") if t]
            return "perm", len(toks), toks
    except ValueError:
        pass
    raise BadInput(f"--free: {spec[:40]!r} is not any:N or perm:ID,ID,...")


def free_set(free_spec):
    """(kind, n_free, multiset or None) of a --free string or an already parsed triple."""
    return parse_free(free_spec) if isinstance(free_spec, str) else free_spec


def fixed_length_claim(prefix, query: int, k: int, n_free: int, multiset) -> dict:
    """The claim: prefix + any string of n_free tokens (multiset None) or every permutation of the
    multiset + query predicts k."""
    free = {"kind": "any", "length": n_free} if multiset is None else {"kind": "perm", "tokens": list(multiset)}
    return {"prefix": list(prefix), "query": query, "predicted": k, "free": free}
