

__version__ = "0.1.0"     # = pyproject.toml's version (tests/audit/test_cli.py keeps them equal)
