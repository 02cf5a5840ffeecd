"""tcert generator: fast float computations that emit certificates (untrusted by the checker)."""

import os

# The repository's shipped examples (default demo model, example certificates, trained text models).
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "certificates")
