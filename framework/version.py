"""ortgen's version, a leaf: what the manifest records and ``ortgen.__version__`` says."""

__version__ = "0.1.0"
