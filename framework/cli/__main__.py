"""``python -m ortgen.cli``: the ``ortgen`` console script."""

from .main import entry

entry()
