"""The ``ortgen`` command: one module per subcommand (each adds its own flags and runs
over the public API), shared flags in ``args``, the parser in ``parser``, running and
exiting in ``main``. ``python -m ortgen.cli`` is the console script."""

from .main import entry, main
from .parser import build_parser

__all__ = ["build_parser", "entry", "main"]
