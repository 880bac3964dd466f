"""Running a parsed ``ortgen`` command: errors as one line, warnings cleaned, and a quick
exit for one-shot commands."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import OrtgenError
from .parser import build_parser


class _CleanWarnings:
    """While a command runs, Python warnings print as ``ortgen: warning: MESSAGE`` on
    stderr: no source path or line, and each distinct message once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def show(
        self, message: Any, category: Any, filename: Any, lineno: Any, file: Any = None,
        line: Any = None,
    ) -> None:  # fmt: skip
        text = " ".join(str(message).split())  # one line, whatever the message holds
        if text in self.seen:
            return
        self.seen.add(text)
        with contextlib.suppress(OSError, ValueError):  # stderr closed: nothing to tell
            print(f"ortgen: warning: {text}", file=file or sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(build_parser().parse_args(argv))


def entry() -> NoReturn:
    """The ``ortgen`` console script: :func:`main`, then, for a one-shot command, an exit
    without the interpreter's teardown.

    Tearing down numpy, onnxruntime and ~250 modules after ``ortgen generate`` has printed
    its answer took 0.08-0.15 s of a ~1.2 s cold start on a 2-core VM (the process start to
    exit that users wait for). The one-shot commands (``one_shot=True`` in their module)
    leave nothing to clean up by then: no worker processes (``run``), no server
    (``serve``), no files being written (``export``); ``atexit`` handlers run (logging's
    shutdown among them), the output is flushed, then ``os._exit``.
    ``main()`` itself returns normally, so it can be called in-process.
    """
    args = build_parser().parse_args()
    code = _main(args)
    if args.one_shot:
        _exit_now(code)
    sys.exit(code)


def _main(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _CleanWarnings().show
        return _run(args)


def _exit_now(code: int) -> NoReturn:
    """End the process at once, after flushing what it wrote (see :func:`entry`).

    ``atexit`` handlers still run (a plugin's, logging's shutdown): what is skipped is the
    interpreter's own teardown, freeing every module and object one by one.
    """
    atexit._run_exitfuncs()  # CPython's, as the interpreter calls it at a normal exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed
            stream.flush()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except KeyboardInterrupt:  # before any text (loading, prefill): nothing to keep
        print("\nortgen: interrupted", file=sys.stderr)
        return 130
    except OrtgenError as exc:
        print(f"ortgen: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ortgen ... | head`: the reader left; not an error
        # point stdout at /dev/null so the interpreter's final flush cannot fail again;
        # stderr stays open for anything still worth saying
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
