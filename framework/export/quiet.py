"""Silence the export stack (transformers, optimum, torch.onnx) while it runs."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

__all__ = ["quiet"]

_QUIET_LOGGERS = ("transformers", "optimum", "torch", "onnx", "onnxruntime", "accelerate")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' logs, warnings, progress bars and prints.

    optimum, transformers and torch.onnx print pages of tracer warnings and validation
    tables; the caller only wants our progress lines. Redirecting sys.stdout/sys.stderr
    is process-wide, so an export should not run next to threads that print.
    """
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    sink = io.StringIO()
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
