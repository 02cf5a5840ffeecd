#!/usr/bin/env bash
# Regenerate every shipped certificate with the generator, from the repository root:
#     bash certificates/regenerate.sh
# Each certificate records the command that wrote it (generator.command); tests/soundness/test_determinism.py
# re-runs each recorded command and requires the same bytes.
cd "$(dirname "$0")/.."
P24=$(python -c "print(','.join(['3','7']*12))")
P12=$(python -c "print(','.join(['0']*12))")
T64=$(python -c "print(','.join(str(x) for x in [1,2,3,4,5,6,7,0]*8))")
M=certificates/models/maxof4_seed123.safetensors
set -e
tcert overwhelm --model certificates/overwhelm/neox1l_tiny.safetensors --prefix-ids $P24 --query-id 5 --free perm:1,2,2,9 --method lp --out certificates/overwhelm/perm_lp.json
tcert overwhelm --model certificates/overwhelm/neox_real_tiny.safetensors --prefix-ids $P12 --query-id 6 --free perm:1,3,3,5 --method tight --out certificates/overwhelm/neox_real_perm.json
tcert overwhelm --model certificates/overwhelm/neox_real_tiny.safetensors --prefix-ids $P12 --query-id 7 --free any:2 --method tight --out certificates/overwhelm/neox_real_any2.json
tcert accuracy --model $M --strategy cubic --out certificates/accuracy/maxof4_seed123_cubic.json
tcert accuracy --model $M --strategy refine --out certificates/accuracy/maxof4_seed123_refine.json
for s in svd svd2 svd-rec exact-eqke svd-rec+eu; do
  tcert accuracy --model $M --strategy subcubic:$s --out certificates/accuracy/maxof4_seed123_subcubic_$s.json
done
tcert influence --model certificates/influence/maxof4_seed123.safetensors --out certificates/influence/maxof4_seed123.influence.json
tcert influence --model certificates/influence/robust2.safetensors --out certificates/influence/robust2.influence.json
tcert influence --model certificates/influence/robust2.safetensors --tokens $T64 --out certificates/influence/robust2.corollary.json
tcert influence --model certificates/influence/toy2_bidir.safetensors --out certificates/influence/toy2_bidir.influence.json
