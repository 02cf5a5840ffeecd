"""Comparing a regenerated certificate with a shipped one across machines: the generator's float steps (an
SVD, an LP solver) end in last bits that OpenBLAS's kernel choice decides, so byte identity holds only on the
machine that wrote the file; everything else must still be equal."""


def as_float(value):
    """`value` as a float when it is a JSON number or a string holding a float (hex or decimal), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str):
        try:
            return float.fromhex(value) if "0x" in value.lower() else float(value)
        except ValueError:
            return None
    return float(value)


def float_differences(a, b, where="") -> list:
    """Where two parsed certificates differ, as (path, shipped, again), except floats within 2^-30 of each
    other relative to max(1, |x|): the last bits a float computation (SVD, an LP solver) leaves to the BLAS
    kernel. Any other difference (a key, a length, a string, an integer, a float further apart) is listed."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [(where, sorted(a), sorted(b))]
        return [d for k in a for d in float_differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(where, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in float_differences(x, y, f"{where}[{i}]")]
    if a == b:
        return []
    fa, fb = as_float(a), as_float(b)
    is_int = isinstance(a, int) and isinstance(b, int)
    if fa is None or fb is None or is_int or abs(fa - fb) > 2.0 ** -30 * max(1.0, abs(fa), abs(fb)):
        return [(where, a, b)]
    return []
