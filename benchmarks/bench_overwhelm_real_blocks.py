"""Benchmark: overwhelm `--method tight` on a paper-scale real GPT-NeoX block (issue 6, part 3).

    python benchmarks/bench_overwhelm_real_blocks.py [--workdir DIR] [--n-fix 1500]

bench_overwhelm_tight.py (same query, 35-token multiset, repeated-token prefix, force=True, checker = Arb
in a fresh process) on another model: the shape of bench_overwhelm.py (d_vocab 30522, d_model 512, 8
heads of 64, d_mlp 2048) as a Pythia-style block with separate ln1/ln2, a final LayerNorm, exact-erf GELU,
every bias drawn (std 0.1) and partial rotary (rotary_dim 16 = 25% of the head, as in Pythia), seed 0.
Use a workdir of its own: the model file keeps bench_overwhelm_tight's name.
"""

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def build_model(path):
    """The paper-scale real-block model (cached at path)."""
    import bench_overwhelm as bo
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    if not os.path.exists(path):
        t, c = random_model("neox1l", seed=0, shared_ln=False, final_ln=True, act_fn="gelu", rotary_dim=16,
                            bias_std=0.1, **bo.SHAPE)
        save_model(path, t, c)
    return load_model(path)


if __name__ == "__main__":
    import bench_overwhelm
    import bench_overwhelm_tight
    bench_overwhelm.build_model = build_model
    if "--workdir" not in sys.argv:
        sys.argv += ["--workdir", tempfile.mkdtemp(prefix="tcert-bench-overwhelm-real-")]
    bench_overwhelm_tight.main()
