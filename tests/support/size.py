"""The checker's size as a contract: code lines per part of the trusted base, against a budget.

A code line is a line holding code: not blank, not only a comment, and not part of a docstring (module,
class or function). Parts: the shared kernel (checker/*.py and checker/kinds/__init__.py) and one per
certificate family (checker/kinds/<family>/). tests/checker/test_trusted_base.py fails when a part is
above its budget or when the generated table in docs/checker-size.md differs from the code:

    python -m tcert.testing.size                              # print the table
    python -m tcert.testing.size --write docs/checker-size.md # regenerate the committed table
"""

import ast
import io
import sys
import tokenize

from tcert.testing import ROOT

CHECKER = ROOT / "checker"
FAMILIES = ("prediction", "overwhelm", "accuracy", "influence")
# Code lines each part may have (docstrings excluded). Before the one-room-per-family restructure the same
# counter gave kernel 986, prediction 34, overwhelm 653, accuracy 466, influence 243 (2,382 in all; 2,941
# with docstrings, the figure the project quoted then). The restructure split every long function and
# declared the backend interface, which cost lines: each budget is the part's count after its refactor
# (kernel 1,040 plus 30 for the assignment-LP dual module that overwhelm moves to checker/). The exact
# linear-algebra layer (checker/exact_*.py: products on float64 BLAS without rounding, and their outward
# rounding) is its own part, at its count when it was added. A budget may only go down, except by exactly
# what a new piece of the architecture costs; the checker total's budget is their sum. The Llama-family
# pieces (RMSNorm, SiLU, gated MLP, grouped-query attention, linear RoPE scaling, BF16, the TransformerLens
# config names) added kernel 81 (modelfile.py 54, forward.py 27), and the one-line refusals overwhelm 2
# and influence 3. The accuracy refining strategy added 390 (refine.py 211: cubic cases, mixed entries and
# pattern groups; rows.py 91: the int64 per-query rows it shares with the pruned brute-force checker;
# distribution.py 69: weighted input distributions for every strategy; the claim and dispatch in
# __init__.py 20; brute.py shrank by 5 on the shared rows). The exact layer under the Backend interface
# (IMat ends, routed products, column bounds from ends, the backends' way in and out) added kernel 33
# (interval.py, flint_backend.py, mpmath_backend.py) and exact 69 (checker/exact_backend.py, the zero-line
# cut and a faster interval_from_arb). The tighter influence constants (LayerNorm variance lower bounds
# over the reachable residuals, per-head score widths and per-row causal caps, per-head value balls, gains
# folded into the readers' matrices) added influence 82 (sublayers.py, reach tracking in blocks.py, row
# caps in rates.py), and the local claim form (one input's own attention pattern, local.py) influence 90.
# The hostile-input work added kernel 120 (checker/resources.py 53: the
# resource model; bounded exact endpoints, directed integer conversions and the point-product spread guard
# in interval.py / mpmath_backend.py / numbers.py; the JSON reader's memory estimate; --max-work/--max-memory)
# and one cost.py per family (prediction 4, overwhelm 43, accuracy 14, influence 11) plus overwhelm tight's
# sharp-attention scaling (12) and influence's bounded H_n (5). The error-ball forward pass (error_balls.py
# 125, operator_norms.py 77, forward.py 35, the backends' `centres` primitive: interval.py 2,
# flint_backend.py 8, mpmath_backend.py 17) added kernel 264, and the prediction kind's own precision raise
# (precision.py 21, __init__.py 34) prediction 55.
# The auditor's kit added kernel 320 : checker/statement.py (182: the
# claim in words, a new obligation every kind passes; 14 of them the influence local form's sentence),
# tcert-check's contract in checker/cli.py (+124: usage errors as JSON, --timeout, --report, the precision
# retry after a REJECTED, help with defaults and exit codes; its progress line, clock, versions and JSON
# figures live beside the trusted base in tcert.audit), and the optional envelope fields (+14).
# The accuracy check-time work added accuracy 197: the int64 screen of the cubic cases and refine's mixed
# entries (screen.py 57, cubic.py 24, refine.py's mixed_screened / key_bounds_int64 / require_mixed), the
# coupled bound of refine's rule "e" (rows.py 11: coupled, fixed_terms; refine.py's coupled_groups,
# coupled_credit, fixed_weight, rows_weight: refine.py 104 in all) and tables.py 1.
# The local claim's exact per-position rule (every token's score and value distance at every non-final
# position of the input: local.py position_bounds, norms.py row_dists) added influence 24. The Llama-family
# influence constants (RMSNorm maps, the gated MLP's constants, grouped-query key/value heads; the one-line
# refusal moved to the local rule and the duplicate act_lipschitz dropped for the kernel's) added influence 16,
# and the local claim's own cost estimate (cost.py) 5.
# The exact layer as the default backend's products added exact 185 (exact_rounding.py 158: the two-part
# exit split_bounds with its two-word total and float64 split, the two-part way in from Arb and mpmath,
# two-part ends into Arb (summed and rounded once at 128 bits) and mpmath; exact_backend.py 27: ends as tuples of parts, exact column extremes
# of two-part ends, point operands cut once) and kernel 18 (forward.py 17: block 0 once per distinct
# token; interval.py 3: the backend names' exact-layer default; the two backends' way in 2 fewer).
# Offering every backend name at tcert-check's --backend (flint-exact, mpmath+exact beside the defaults) added
# kernel 3 (interval.py BACKEND_NAMES, cli.py's help for the exact layer).
# The exact layer's code that no verdict path reaches left the trusted base for tcert.testing.exact_reference
# (the tests and benchmarks/bench_exact_products.py use it): round_out and its helpers, exact_integers, the
# Rounded branches of to_arb_mat / to_mpf_rows, interval_from_arb / interval_from_mpf, Interval, interval_grid,
# interval_product / point_interval_product with their envelopes and point_product's `keep` form, Slices.T and
# abs_upper, Exact negation and subtraction, ExactInterval.shape, bfloat16_matrix: exact 273 fewer
# (exact_products.py 143, exact_rounding.py 130).
# The one-more-read clean-up: refine.coupled_groups (47 lines) split into grid_fillings / grid_proved /
# unproved_inputs / grid_axes (accuracy +11: signatures and docstring-free lines of the split); exact_rounding's
# mpf_ends shared by ends_from_mpf and the reference module's interval_from_mpf (exact +1).
# error_balls.take returns its input only for the identity index list (it did for any list of the right
# length), so forward.py's separate gather `spread` went: kernel -4.
# Native Arb operands entering the exact layer as balls (midpoint-radius products) and column extremes merged
# as float64 parts added exact 70 (exact_backend.py 52: ball_times_point, _times_point, _ceil_bits, sum_cut's
# transposed / |W| forms, column_extremes, merge_extremes, fractions; exact_rounding.py 18: ball_from_arb),
# kernel 9 (interval.py: IMat.col_extremes, Backend._native_ball; flint_backend.py: its ball) and overwhelm 6
# (tables.py / upto.py: EVOU extremes merged over the chunks, Fractions made once). Their Fractions made with
# one Fraction per entry (_sum_of_floats) added exact 5. overwhelm tight's W_U[:, j] - W_U[:, k] as an exact
# point matrix where every float64 difference is exact (tight.py exact_differences) added overwhelm 7.
# The accuracy tables' integer ends without a Fraction per entry: the Backend primitive fixed_ends (floor /
# ceiling of 2^shift times each entry's ends; flint reads Arb's mantissa and exponent) and interval.fixed_end
# (kernel +24: interval.py 16, flint_backend.py 8); tables.numerator_bounds reads its ends once, at a shift
# chosen from the deepest score, and evaluates no exp where the score lies below -MAX_BITS (accuracy +4).
# refine's rule "e" grids as long as their chunk's largest m (accuracy +1). cubic.screened's case-level terms
# once per case and each case's worst key term by a reduction (accuracy +7 with refine.mixed_screened's
# per-entry terms). The envelope's tree check skips scalar leaves within the depth limit (kernel +2).
# rows.query_rows' exponents and shifts elementwise on object arrays (accuracy +1: BIT_LENGTH).
# refine.refuted: rule "e"'s grid leftovers shown wrong at the grid's competitor are not decided one by one
# (not crediting is sound; a correct input is never refuted): accuracy +8.
# The local claim's gap rules added influence 129 (local.py: the exact single-change rule, safety_radius /
# unscreened / exact_gaps / parse_changes / survives_one, ~60; the per-competitor direction rule for R >= 2,
# gaps / projections / multi_floors / gap_floor / parse_competitors / survives, ~55; head_moves split out of
# movement; cost.py 2 for the hints' work).
# Influence at GPT-2 width (speed only, same bounds): the trace-power bound's last squaring as an entrywise
# trace (norms.py gram_norm) and a LayerNorm-folded wide reader's norm from its Gram matrix F (W W^T) F^T / d^2
# without the d x d_mlp interval matrix (norms.py folded_norm, sublayers.py fold_norm), and diag(w) W as an
# exact point for float16/32 weights instead of a d x d product (norms.py scaled_rows), and each LayerNorm
# map's min over W_E without a Gram matrix per block of rows (norms.py row_squares): influence 34.
# overwhelm tight's cheap bound from one product of the beta row with the extremes' float64 parts (tight.py
# free_sums_upper; the exact Fraction sum only for a competitor whose bound from it is not < 0) and the final LN's
# centring as an exact integer point matrix scaled once (final_ln.centred, replacing centring / transform) added
# overwhelm 12; a run of rows accumulated through a view (exact_products._add_block) added exact 2.
# screen.value_bounds lost an unused unpacking of the tables (accuracy -1).
# rows.query_view: the per-query (rows, Eq, Dal) brute and refine each built by hand (accuracy -1).
# Influence at Pythia-160M shape (d_vocab 50304): block 0's value sets and the unembedding's radius over the
# vocabulary by blocks of tokens instead of 38.6M-ball interval tables (influence/vocabulary.py 157: two passes,
# bounding box then distances as one more product, LN1 of the embeddings through the exact layer; the tables
# kept below 2^20 entries; blocks.py / norms.py / __init__.py wiring, the lazy folded unembedding, W_E's row
# norms by row_squares: +4) added influence 161, and the exact layer's elementwise pieces (exact_backend.py:
# outer_floats, dyadic_float, _pieces, _sums, max_row_square, widths, scaled_rows_bounds, point_bounds,
# max_quadratic) exact 76.
# interval.shift_out / require_magnitude shared by bounded_end and fixed_end (kernel -2); local.exact_gaps
# reads the final LN's gain and bias once, not per listed change (influence +1).
# The local claim's saturation rule for R >= 2: exact_backend.difference_minima, the column
# minima of row-wise differences of x W_U for every competitor at once, TwoSum-exact, Rejected on overflow, per column or per row (exact +38);
# local.projections reads them and x's own values, multi_floors the saturated head, exact_gaps forms o' from the
# sums without key j, cost.py the V x V product per head (influence +22). position_bounds in Python integers at
# 2^-SCALE rounded outward (fixed_ends), not one Fraction per token (3x faster), and head_view's last-token row by a
# one-hot product, not V x d rows per head (influence +7). exact_gaps' smallest gap per listed change by
# difference_minima per row ([y', 1] times [W_U; b_U]), not one interval end per change and token (influence +1).
# The forward pass on the exact layer (centres held as float64 parts, no Arb entry per activation) added
# kernel 137 (error_balls.py 108: exact_affine, exact_normalise, Rotation / rotation / rotation_rows,
# exact_rotate, take and recentre on parts, row_sq_norms from exact squares; forward.py 26: Weights.affine,
# the Rotary tables at twice the precision, rotated, normalised's exact branch; interval.py / flint_backend.py
# 3: _near_ball) and exact 146 (exact_products.py 59: entrywise / entrywise_sum, _line_top / _line_digits,
# row_sums; exact_rounding.py 42: split_centre, near_ball_from_arb; exact_backend.py 45: parts_times_point,
# point_parts, affine_centres, balls_times_points for points of several parts, times_parts, multi_point,
# magnitude_of (|W|'s cut from W's), the radius product skipped for points). Centres' second parts cut to
# 24 bits (exact_rounding.trimmed, error_balls.trimmed_centre) and entrywise sums in float64 while exact added
# kernel 6 and exact 12; a point of several parts times a point cut whole (exact_backend._times_point) exact 5.
# refine's rule "e" unclaimed hint (lrat-style: the fillings the generator does not claim are never credited and
# get no test): parse_unclaimed (a vectorised hex parse), the hint taken out of the grid and of rule "e"'s sorted
# count, fillings_weight; refine.refuted and the grids' competitor argmax removed (accuracy +15). The hints of all
# entries read in one pass (parse_unclaimed: seed1's 1,267 entries 0.040 -> 0.010 CPU s), separable's failing
# fillings only where rule "e" reads them, grid_proved negated (no negation of its big arrays), unproved_inputs
# split by runs (accuracy +10). Under plain counting (every weight 1, no max_at_least) the cubic cases' and mixed
# entries' weight is their input count, without a Distribution.case per entry (accuracy +1). The unclaimed hints
# bounded in total (MAX_UNCLAIMED_DIGITS: bounded memory for a hostile certificate; uint8 digits) (accuracy +4).
# difference_minima without TwoSum (whose exactness needs round-to-nearest): D = w[:, k] 1^T - w exact in float64
# (column_differences; exact_differences moved here from overwhelm tight), then x D through the exact layer,
# the interval route as fallback (exact +12, overwhelm -4). Its split-form check is outer_floats' and D is cut
# once, not once per block of rows (exact -3).
# Refine's pattern groups of 1 or 2 free positions (both rules) settled in brute force's shape: one grid per
# position pattern for the groups of many queries at once (their rows built together by rows.stacked_view /
# stacked_rows, rows.stacked_fixed_terms), the top-2 bound first and the coupled bound only on the rows its
# failures reach (grid_coupled), the groups in bands by max token; rule "d"'s sorted count kept for 3 free
# positions (accuracy +35; seed1's pattern groups 0.28-0.34 -> 0.15-0.21 CPU s, the same credits).
# The prediction kind's logit gaps by the exact layer in Python integers (prediction/gaps.py: GapTable, column
# norm bounds of float16/32 W_U from exact squares on per-column units, the gap table from c W_U read as integers;
# __init__.py: the table through gap_at / certify_gap, Fractions only for the gaps below the margin): prediction
# +95; exact_rounding.row_integers (an exact product's row as Python ints on one power of two): exact +9.
# The forward pass's radii in integers (error_balls.py: up / sqrt_up / sqrt_down through _up_int / _sqrt_int,
# up_affine and sqrt_sum_up for the per-row radii of dyadic terms, the same values as the Fraction forms;
# row_sq_uppers: head_output's maxima from exact sums without an enclosure per row; exact_rotate's delta term
# from the centre's largest entries instead of exact row norms): kernel +32.
# LayerNorm's bias inside the normalised centre's two parts instead of a third part (exact_products.plus_row: b
# as one more exact term on the product's scales; error_balls.exact_normalise): exact +17, kernel +2.
# entrywise_sum's digit products as the first factor's digits times `_partials` of the others (same-offset
# products summed while exact; peaks measured once per digit), and one Fraction per row in split_centre and
# trimmed: exact +12.
# entrywise_sum's squares x * x with each digit pair once, doubled (exact +3).
# W_U's cut for the gap table from the row cut of its transpose (gaps.unembedding_cut: the same Slices as
# cut_cols, contiguous blocks): prediction +5.
# The gap table's first-digit screen (gaps.top_digit, screened_columns, exact_columns, contenders: every column
# bounded from W_U's first digit, only the contenders cut whole; the same extremes and gaps below a margin):
# prediction +38 (the paper-scale table 1.2 -> 0.26 s CPU).
# Each head's softmax and P V at twice the working precision where the exact layer is on (error_balls.head_output
# with `fine`, fine_heads, moved; the centre out as two float64 parts; heads_output multiplies the heads' parts side
# by side exactly; forward.attention_output encloses the divisor there): kernel +18 (1 layer of GPT-2-small
# width: 2^14.5 -> 2^11.5 ulps); P V there by the exact layer (error_balls.pattern_times_values: the pattern's
# fine balls within d of two float64 parts times the values' parts, exact_backend.near_times_parts midpoint-radius;
# product's exit split out as exact_backend.leave): kernel +4, exact +4 (a head at 1,024 tokens 0.18 -> 0.15 s).
# Centres trimmed at a row-relative bit, 2^(row top - 84), both parts (exact_rounding.trimmed; was: the second
# part to 24 significant bits): at most 4 digits of 21 bits per row in every later product, a trim term ~2^5
# smaller, each row's term one Fraction; exact +4 (K/V's left factor 6,528 -> 5,515 row-digits at paper scale).
# exact_affine's per-row radii decompose each row's dyadics once for all heads (up_affine's `split`): kernel -1.
# The local claim for L >= 2 layers by propagated bounds (propagated.py 222: x's own forward pass per block,
# the block constants, the per-query head rule with wild keys, the changed position's V candidate rows per block
# (block 0; every block of a causal model) and the per-token rule on them, the propagation per changed position;
# local.py +26: the L-layer dispatch, final_parts split out, propagated_floors / survives_propagated; cost.py +5)
# added influence 253.
# Influence at 12 layers of Pythia-160M shape (speed, the same numbers): W_E's squares and sums made once and
# shared by every LayerNorm map's minimum, the token norm and block 0's value sets, a parallel block's two maps
# reading one minimum (norms.py RowTerms / centred_minima, blocks.py Reach.embeds): influence +18. Block 0's
# value sets without scaling any entry by 1/(d sigma): the point Z = x G_lo per block of tokens, each head's
# centre from float estimates (any centre is sound) and its radius from the quadratic form s^2 q Q q^T + 2 s q
# W_O m^T + |m|^2 per row, the error term with ||W_O||_2 (vocabulary.py scaled_value_sets / head_ball, replacing
# fast_blocks): influence +30; exact_backend.quadratic_rows (max_quadratic's per-row bounds): exact +3.
# At that merge: exact_backend.dyadic_float and scaled_rows_bounds removed (no verdict path read them after
# fast_blocks went): exact -17. error_balls.normalise_radii split out of exact_normalise (46 code lines): kernel +4.
# refine derives its cubic sets instead of reading ~6,200 cases: screen.cubic_sets (the cubic rule on the int64
# screen for every (m, q, c, k) at once, the four sign cases regrouped; cubic.screened now reads it, -20 there),
# refine.CubicSets / cubic_weight (the sets as a mapping, their count by size histograms), the mixed set's
# disjointness from the derived set as an obligation; refine.token_set replaced by cubic.parse_mask (accuracy +21).
# refine.key_bounds_int64 reads the derived sets' array for every token at once; screen_tables' e mantissas by
# rows.shifted_each (accuracy -2). cubic_sets by blocks of max tokens (SETS_CHUNK) and refused beyond MAX_SETS
# (bounded memory whatever d_vocab: the sets no longer scale with the certificate) (accuracy +7).
# overwhelm tight's cheap bound screened by one exact product of leading digits (exact_backend.leading_maxima /
# leading_digit_maxima: 22-bit digits of the ball's midpoint and of W_U - W_U[:, k], the rest bounded by
# magnitudes as powers of two) instead of the full 280 x 512 x 30522 ball product, which now runs only on the
# columns the screen leaves undecided or near the worst bound (tight.py screened_sums / near_worst /
# product_bounds, +23): exact +20; tight's Dinkelbach c_hj from one product of the stacked EVO rows (head_blocks,
# replacing the per-head M_w rows) +4 and sigma_hi's row norms from one call over the stacked rows +2, the float
# estimates that choose the near-worst columns kept finite-safe (tight.estimate, errstate) +7: overwhelm +36.
# refine7: rule "e"'s coupled bound on the leftover fillings only (refine.sparse_coupled, replacing the full-grid
# grid_coupled; all queries' rows in one stack) (accuracy +3). Groups of 3 free positions as flat fillings
# outside K^P (refine.outside_fillings, replacing separable's sorted counts and its K^P subtraction; the
# unclaimed hint removed before any test); rows.top_two by a partition, the H bounds by max / min of the two
# ends' products (accuracy -29). sparse_coupled couples the second free position only on the fillings the
# first leaves; fixed_weight's counting fast path (accuracy +3). mixed_screened returns per-entry arrays (the
# disjointness from K and |K| read from the derived sets' array), rule "e"'s unclaimed fillings by a base-m
# lookup table, rows' magnitude assertion from the three tables' maxima (accuracy +4). cubic.parse_mask reads
# the set bits byte by byte (BYTE_BITS) (accuracy +2).
# The MLP's optional diameter constant (sublayers.mlp_diameter / SPLIT_ACTS / MLPBounds.diameter, Ledger.optional,
# its use in blocks.block and propagated.moved_last): influence +15.
# pred4: a point product's left digits of one right digit stacked into one BLAS call (exact_products._stacked)
# exact +9; the prediction gap screen by 2,048-column blocks of W_U (gaps.screened_centre) prediction +8.
# The coarse first pass at 48 bits (prediction.coarse_gap, precision.COARSE_PREC) prediction +10, and the trim
# width by working precision (exact_rounding.trim_below: 63 bits kept at <= 48, 84 above) exact +3. tcert-check
# imports every library for its versions only where they are printed (--json, --report): kernel +1. A point
# of several float64 parts cut as one sum with exact carries (exact_products.cut_sum_rows; parts_times_point
# falls back to a cut per part where the first digit would pass 2^b): exact +23. At working precisions up to
# 48 bits the rotary cos/sin and the LayerNorm scale enter as one float64 part (error_balls.near_parts): kernel +8.
# Keys' and values' radii as one bound per head (error_balls.uniform_radius, exact_affine / exact_rotate's
# `uniform`; head_output reads only their maxima): kernel +15 (paper-scale check 2.07 -> 2.01 s CPU).
# Rotation.delta one bound for all rows (no Fraction per row, no max per head): kernel -1.
# One-part near balls asked of the backend (Backend._near_ball(data, parts), exact_rounding.near_ball_from_arb's
# parts loop) instead of derived from two parts (error_balls.near_parts): kernel -5, exact 0 (Rotary.exact at
# 48 bits 0.152 -> 0.118 s at paper scale).
# softmax's shift given (any rational: the exact softmax does not depend on it): head_output passes each row's
# top from one col_bounds instead of an upper end per score: kernel +1 (softmax 0.040 -> 0.012 s exclusive).
# The paper-scale prediction check 1.87 -> 1.39 s CPU (wave-i-pred): values after the pattern where few queries
# are asked (forward.mixed_values; error_balls.head_outputs / pattern: heads reading the same value rows share
# one product P V; stack, largest), the keys', queries' and values' norms from rounded-up grid squares cached per
# matrix (error_balls.row_sq_max, _square_sums), the rotary cos/sin by angle addition (forward.rotary_tables):
# kernel +60; LayerNorm's centring without a product (exact_products.centred), the grid square bounds
# (exact_products.row_square_bounds), one trimmed pair for uniform radii and shared per-exponent Fractions
# (exact_rounding.trimmed, split_centre), affine_centres' unused bias-free form dropped: exact +29.
# The int64 work of the accuracy strategies from float64 ends instead of per-entry Python ints (refine's check
# on trained Max-of-4 seeds ~0.12 -> ~0.09 CPU s): Backend.float_ends (the nearest float of each exact end, one
# step out; flint from Arb's ends without a Fraction) and interval.outward: kernel +14; tables.float_tables and
# tables.Tables (the exact integer tables built only on an exact fallback's first read), tables.numerators split
# from numerator_bounds, rows.scaled_ends / mantissas (exact floor / ceil of float64 ends at a power of two),
# rows.stacked_rows and screen_tables on int64 mantissas (BIT_LENGTH, shifted, shifted_each, shifted_int
# removed): accuracy +28. Refine's mixed entries' key bound of the derived sets from screen.cubic_sets' per-case
# maxima ("cubic keys") +8; the pattern groups' query rows only for key tokens up to each stack's largest max
# token (rows.stacked_rows / stacked_view `tokens`, QUERY_BANDS) +5; parse_mixed's one-line entry test with
# refine.mixed_fields naming the field at fault, each (hexmask, m) read once +7: accuracy +20. cubic_sets'
# c = n-1 on the q = m entries only, rows.top_two without a partition: accuracy +4.
# Both merged (wave I): kernel 2159 + 60 + 14.
# The heads of a block stacked (the optional constant Ll.attn.stacked: sublayers.stacked_radius, its use in
# blocks.attention, its products in cost.py; grouped-query names): influence +12.
# The two checker functions over ~45 code lines split, one obligation each (screen.cubic_sets' blocks as
# screen.block_sets, with each c's ends computed once for every block; refine.coupled_groups' chunks as
# refine.chunk_proofs): accuracy +9.
# The sublayers' moves added as one vector (the optional constant spread<k>.joint: joint.py, its terms carried by
# blocks.Induction / AttentionBounds.radii / MLPBounds.norms, the MLP weights' scales MLP_SCALES, block 0's finite
# values also as heads (two variants, joint.scaled_bound), its products in cost.py): influence +61.
# refine.mixed_screened's terms once per distinct (m, q, S) (refine.query_terms) and the two forms of the bound
# each on its own entries (refine.screened_bounds): accuracy +11.
# envelope._flat_rows (a list of rows of JSON scalars passed by C-level passes, not a walk per row): kernel +7.
# parse_patterns' one-line entry test with refine.pattern_fields naming the field at fault: accuracy +5.
# The pattern groups' cubic sets as boolean rows of CubicSets.K (grid_fillings, not lists): accuracy +1.
# rows.top_two from rows.row_tops (argmax, then the max with the largest masked): accuracy +6.
# screen.weights and block_sets reading by flat indices (np.take / np.put): accuracy +3.
# tables.float_tables(library=True) for brute force and refine (Arb's own products, the exact layer off): +1.
# refine.outside_fillings by broadcast assignment into one array per group (not meshgrid + stack): +5.
# refine.py's evidence readers moved to refine_parse.py (refine.py 638 -> 532 lines; imports, constants): +8.
# The paper-scale prediction check's coarse pass (wave-j-pred): at working precisions up to 48 bits a centre
# is the high word of its exact result (exact_rounding.split_centre's `word`, _word_parts; error_balls.WORD_PREC
# and trimmed_centre's word branch, which now takes the Exact; trim_below and COARSE_TRIM dropped), the other
# factors' digit products made once per entrywise product (exact_products._partials): kernel +7, exact +8.
# The rotary tables by exact angle addition (forward.rotary_factors replaces rotary_tables: only the factors
# leave Arb; error_balls.rotation adds the angles on the parts, _table rounds each table to its nearest float
# at 48 bits with an exact distance, _rotation lays it out): kernel +20 (Rotary.exact 0.110 -> 0.030 s).
# The gap screen's bounds in one pass per column (gaps.screened_columns: slack per distinct column top, centre
# and bias shifted together; exact_gap_table: one shift per bound; _on returns its list when no shift): prediction +1.
# The coarse pass's spectral norms by a shorter trace-power chain (prediction.precision.COARSE_SQUARINGS; Weights
# keys its norms by their chain length, forward.Weights.squarings): kernel +1, prediction +1.
# rows.stacked_rows: the query position's rows for token q only (the others the loose bound, rows.loose_bounds),
# fewer full-size temporaries (V's small terms summed first, interval_products into given arrays, align_up): +17.
# screen.value_bounds for every max token at once (screen.others_max, rows.top_two; no loop over m, the
# d_vocab >= 2 refusal): +3.
# rows.top_two_gaps (D as the row's largest minus Hl, corrected at the argmax; no full-size where): +5.
# LayerNorm's squared row norms by row dots of the carried digits (exact_products.row_squares, dyadic; was
# row_sums of an entrywise square, now its fallback; digits of every row used in place): exact +19. Cutting in place (_scaled_digits scales and
# subtracts into its own block; _cut compresses by the digit statistics' line maxima; _assemble keeps a single
# block's arrays): exact +3. Factors of entrywise products cut once and reused (exact_products.LineCut, line_cut,
# permuted, _factor_cuts, entry_bits, line_top): the rotary cos/sin tables cut once for all heads and the swapped
# keys' digits permuted, not cut again (error_balls.rotation_cuts, exact_rotate's `tables`; forward.rotated): exact
# +30, kernel +8 (with tcert-check's allocator setting, cli.main -> tcert.audit.terminal.keep_freed_memory).
# LayerNorm's per-row radii in unreduced integers, no Fraction per operation (error_balls.normalise_radii,
# _lip_int): kernel +15.
# Wave K (refine's check): the softmax numerators' float64 ends in one pass per row (Backend.exp_ends, flint's
# fused x - c, exp and float ends; FlintBackend.float_ends tests finiteness only when an end is not finite):
# kernel +17; tables.numerator_ends (the entry-by-entry fallback) and the pattern grids' flat-index and boolean
# passes (refine.top_two_fails, chunk_proofs, sparse_coupled, unproved_inputs, grid_fillings): accuracy +19.
# rows.stacked_rows / stacked_view by blocks of ROW_BLOCK queries (block-sized temporaries; top_two_gaps and
# align_up into given arrays): accuracy +9. The pattern groups' stacks in shared buffers, the largest first
# (rows.workspace; refine.pattern_weight's scratch): accuracy +8. FlintBackend.float_ends / exp_ends' ends as
# two lists of floats, not a tuple per entry (each a container the garbage collector tracks): kernel +1.
# refine.pattern_credit's unclaimed fillings folded into its masks (no copy of the fillings), fillings_weight
# counting the mask under uniform counting, rows.coupled's top-2 terms gathered once: accuracy +4.
# Merging wave-k-pred and wave-k-refine: kernel +2 over the two increments (both edited budgets from 2268).
BUDGETS = {"kernel": 2311, "exact": 1053, "prediction": 253, "overwhelm": 764, "accuracy": 1414, "influence": 1311}
PLACES = {"kernel": "checker/*.py but exact_*.py, checker/kinds/__init__.py", "exact": "checker/exact_*.py"}


def parts() -> dict:
    """part name -> the checker files it holds (sorted)."""
    exact = sorted(CHECKER.glob("exact_*.py"))
    out = {"kernel": sorted(set(CHECKER.glob("*.py")) - set(exact)) + [CHECKER / "kinds" / "__init__.py"],
           "exact": exact}
    for family in FAMILIES:
        out[family] = sorted((CHECKER / "kinds" / family).rglob("*.py"))
    return out


def docstring_lines(source: str) -> set:
    """The line numbers of every module, class and function docstring in `source`."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(path) -> int:
    """Lines of `path` holding code: not blank, not only a comment, not a docstring."""
    source = path.read_text()
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstring_lines(source))


def counts() -> dict:
    """part -> (code lines, {file relative to the repository: code lines})."""
    out = {}
    for part, files in parts().items():
        per_file = {str(f.relative_to(ROOT)): code_lines(f) for f in files}
        out[part] = (sum(per_file.values()), per_file)
    return out


def table() -> str:
    """The generated Markdown page docs/checker-size.md."""
    rows, total, modules = [], 0, 0
    for part, (n, per_file) in counts().items():
        total, modules = total + n, modules + len(per_file)
        where = PLACES.get(part, f"checker/kinds/{part}/")
        rows.append(f"| {part} | `{where}` | {len(per_file)} | {n} | {BUDGETS[part]} |")
    return "\n".join([
        "# The checker's size",
        "",
        "Generated by `python -m tcert.testing.size --write docs/checker-size.md`; do not edit by hand.",
        "`tests/checker/test_trusted_base.py` fails when a part exceeds its budget or this page differs",
        "from the code. Code lines: not blank, not only a comment, not part of a docstring.",
        "",
        "| part | files | modules | code lines | budget |",
        "|---|---|---|---|---|",
        *rows,
        f"| **checker total** | `checker/` | {modules} | {total} | {sum(BUDGETS.values())} |",
        "",
    ])


def main(argv=None) -> int:
    """Print the table, or write it to the path after --write."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write"] and len(argv) == 2:
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(table())
        return 0
    if argv:
        print("usage: python -m tcert.testing.size [--write PATH]", file=sys.stderr)
        return 2
    print(table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
