"""tcert generator: fast float computations that emit certificates (untrusted by the checker)."""
