"""`tcert experiment ...`: paper reproductions (sweeps of generate-and-check cells)."""

from tcert.generator.experiments import maxofk_sweep, overwhelm_paper, repetition


def add_commands(sub):
    """Register `tcert experiment ...`."""
    exp = sub.add_parser("experiment", help="paper reproductions")
    esub = exp.add_subparsers(dest="experiment_command", required=True)
    overwhelm_paper.add_command(esub)
    repetition.add_command(esub)   # appendix F: `overwhelm-repetition`
    maxofk_sweep.add_command(esub)
