"""`tcert train maxofk | text`: train the models the experiments certify (needs the `train` extra)."""

from tcert.generator.train.maxofk import add_maxofk_command
from tcert.generator.train.text import add_text_command


def add_commands(sub):
    """Register `tcert train ...`."""
    train = sub.add_parser("train", help="train models (needs the torch extra)")
    tsub = train.add_subparsers(dest="train_command", required=True)
    add_maxofk_command(tsub)
    add_text_command(tsub)
    for p in tsub.choices.values():   # training prints its own progress: no elapsed-time line beside it
        p.set_defaults(own_progress=True)
