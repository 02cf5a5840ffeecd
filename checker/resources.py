"""The resource model: the work and memory a check will need, estimated before any heavy work.

verify() reads the certificate (the JSON reader bounds its own memory: `envelope.parse_memory`) and the
model, then asks the kind's package for its cost (`cost(cfg, claim, evidence) -> Cost`, in
checker/kinds/<kind>/cost.py, found by `kinds.cost_for`) and refuses a check above the limits (BadInput, exit 2: one line with the
estimate and the option that raises the limit) before any enclosure is computed. docs/soundness.md
("Resource model") states every formula and the defaults.

Units, calibrated with Arb at 64 bits on this project's machine:
* work: operations; one operation is one interval operation done by Python code (about 1 us with Arb;
  mpmath is 10-20x slower), a multiply-add inside an interval matrix product counts MATRIX (Arb: ~5 ns),
  an exact-integer table entry operation of the accuracy strategies INTEGER;
* memory: bytes; an interval held in a Python list counts SCALAR_BYTES (measured: 200 per score entry of
  the forward pass), an entry of an interval matrix MATRIX_BYTES.

The estimators read the claim and evidence before the kind validates them, so they only measure (list
lengths, integers within range: `length`, `at`, `count`) and never raise; a malformed field costs
nothing here and is refused by the kind's parser before its work starts.
"""

from typing import NamedTuple

from tcert.checker.errors import BadInput

MATRIX = 0.01
INTEGER = 0.1
SCALAR_BYTES = 256
MATRIX_BYTES = 100
DEFAULT_WORK = 1e10            # operations: about 3 CPU-hours with Arb
DEFAULT_MEMORY = 16 << 30      # bytes


class Cost(NamedTuple):
    """Estimated work (operations) and peak memory (bytes) of a check, and what dominates it."""

    work: float
    memory: float
    what: str = ""

    def __add__(self, other):   # both at once: work and memory add up
        return Cost(self.work + other.work, self.memory + other.memory, self.what or other.what)

    def then(self, other):   # one after the other: work adds up, memory is the larger
        return Cost(self.work + other.work, max(self.memory, other.memory), self.what or other.what)


class Limits(NamedTuple):
    """The most work (operations) and memory (bytes) a check may be estimated to need."""

    work: float = DEFAULT_WORK
    memory: float = DEFAULT_MEMORY


def require_within(cost: Cost, limits: Limits) -> None:
    """BadInput (one line: the estimate, the limit, the option that raises it) above either limit."""
    if cost.work > limits.work or cost.memory > limits.memory:
        raise BadInput(f"resource limit: checking {cost.what} needs about {cost.work:.2g} operations and "
                       f"{cost.memory / (1 << 30):.3g} GiB of memory (limits: {limits.work:.2g} operations, "
                       f"{limits.memory / (1 << 30):.3g} GiB); raise them with --max-work OPERATIONS / --max-memory GIB")


def at_precision(c: Cost, prec: int) -> Cost:
    """A kind's estimate (made for 64 bits) at `prec` bits: work times (prec/64)^1.6 (Arb's multiplication),
    memory times the mantissa bytes an interval gains above 64 bits."""
    scale = max(1.0, prec / 64)
    return Cost(c.work * scale ** 1.6, c.memory * (1 + (scale - 1) / 8), c.what)


# --- reading the unvalidated claim and evidence ---------------------------------------------------

def at(value, *path):
    """value[path[0]][path[1]]..., or None where a step is missing or of the wrong type."""
    for key in path:
        if isinstance(key, int) and isinstance(value, list) and 0 <= key < len(value):
            value = value[key]
        elif isinstance(key, str) and isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return None
    return value


def length(value) -> int:
    """len(value) for a list or an object, else 0."""
    return len(value) if isinstance(value, (list, dict)) else 0


def count(value, limit: int) -> int:
    """A JSON integer within [0, limit], else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit else 0


# --- shared estimates -----------------------------------------------------------------------------

def weights(cfg) -> Cost:
    """Converting the stored weight matrices to interval matrices, each once (W_U: d_model x d_vocab)."""
    d, dh, H, m, v = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_mlp or 0, cfg.d_vocab
    entries = cfg.n_layers * (4 * d * H * dh + (3 if cfg.gated_mlp else 2) * d * m) + d * v
    return Cost(0.3 * entries, MATRIX_BYTES * entries, "the weights")


def forward_pass(cfg, n: int) -> Cost:
    """The rigorous forward pass on n tokens (checker/forward.py), weights converted: per layer LN, Q/K/V
    products, per head the r x n score rows (r = n before the last layer, 1 in it: R query rows in all),
    softmax and the value product, the MLP on r rows; the unembedding. Memory: one head's score rows, the
    rows of K, V and the residual stream, r rows of Q and the MLP, the logits."""
    d, dh, H, m, v, L = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_mlp or 0, cfg.d_vocab, cfg.n_layers
    R, r = (L - 1) * n + 1, (n if L > 1 else 1)
    products = L * n * d * 2 * H * dh + R * (d * H * dh + 2 * n * H * dh + H * dh * d + 2 * d * m) + d * v
    scalars = L * n * (8 * d + 4 * H * dh) + R * (4 * n * H + 10 * m) + 2 * v
    memory = SCALAR_BYTES * (r * n + n * (2 * H * dh + 2 * d) + r * (H * dh + m) + v)
    return Cost(MATRIX * products + scalars, memory, f"a forward pass on {n} tokens")


def forward(cfg, n: int) -> Cost:
    """The forward pass with its weight conversion."""
    return weights(cfg) + forward_pass(cfg, n)
