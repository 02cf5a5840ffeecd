"""Soundness of overwhelm certificates: whatever the checker VERIFIES, exhaustive 110-bit evaluation confirms.

Random tiny neox1l models (d_vocab <= 7, 1-3 heads, both RoPE pairings, partial rotary, custom attention
scales, near-tied unembeddings), prefixes of several lengths biased towards a dominant repeated token
(so that certificates actually appear), free sets any:N and perm, methods naive and lp, value bounds
table and norm. Every certificate the generator writes is checked by both backends (same verdict) and,
when VERIFIED, the claim is confirmed on every t in T by an independent mpmath forward pass.
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.testing import example_scale
from tcert.generator.overwhelm.naive_lp import generate
from tcert.testing.overwhelm import draw_question, exhaustive_confirms, model_of, tiny_neox1l, verdict

MIN_VERIFIED_FRACTION = 0.2


@st.composite
def scenarios(draw):
    """A random tiny model plus an overwhelm question about it."""
    d_vocab = draw(st.integers(3, 7))
    n_heads = draw(st.integers(1, 3))
    d_head = draw(st.sampled_from([2, 4]))
    rotary_dim = draw(st.sampled_from([d_head, 2]))
    model_args = dict(seed=draw(st.integers(0, 10 ** 6)), d_vocab=d_vocab, n_heads=n_heads, d_head=d_head,
                      rotary_dim=rotary_dim, adjacent=draw(st.booleans()),
                      qk_scale=draw(st.sampled_from([0.2, 0.5, 1.0])),
                      near_tie=draw(st.integers(0, 9)) == 0,
                      attn_scale=draw(st.sampled_from([None, None, "3/2", "5"])))
    question = draw_question(draw, d_vocab, [0, 1, 4, 12, 30], 5)
    return dict(model_args=model_args, **question, method=draw(st.sampled_from(["naive", "lp"])),
                value_bound=draw(st.sampled_from(["table", "table", "norm"])))


def test_verified_certificates_are_true():
    stats = Counter()

    @settings(max_examples=example_scale(300))
    @given(scenarios())
    def prop(s):
        tensors, cfg = tiny_neox1l(**s["model_args"])
        model = model_of(tensors, cfg)
        spec = (s["kind"], s["n_free"], s["multiset"])
        cert, report = generate(model, s["prefix"], s["query"], spec, s["method"], s["value_bound"], "tight")
        stats["examples"] += 1
        if cert is None:
            stats["inconclusive"] += 1
            return
        stats["certificates"] += 1
        verdicts = {b: verdict(model, cert, b) for b in ("flint", "mpmath")}
        assert verdicts["flint"] == verdicts["mpmath"], verdicts
        if verdicts["flint"] != "VERIFIED":
            stats["rejected"] += 1
            return
        stats["verified"] += 1
        stats[f"verified {s['kind']}/{cert['evidence']['method']}/{s['value_bound']}"] += 1
        ok, gap = exhaustive_confirms(model, s["prefix"], s["query"], s["kind"], s["n_free"], s["multiset"],
                                      cert["claim"]["predicted"])
        assert ok, f"VERIFIED certificate contradicted by exhaustive evaluation (gap {gap}): {cert['claim']}"

    prop()
    print("overwhelm soundness:", dict(stats))
    assert stats["examples"] >= example_scale(300)
    assert stats["verified"] >= MIN_VERIFIED_FRACTION * stats["examples"], dict(stats)
    for combo in ("any/naive/table", "perm/lp/table", "perm/naive/table", "perm/lp/norm", "any/naive/norm"):
        assert stats[f"verified {combo}"] > 0, f"no verified example for {combo}: {dict(stats)}"
