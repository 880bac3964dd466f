"""Giving memory back to the OS after a prefill.

A prefill chunk of a long prompt needs far more scratch memory than a decode step: its
activations go through onnxruntime's CPU arena, its outputs and the loop's temporaries
through the C heap. Both keep what they freed for reuse, so a server's RSS stayed at the
largest shapes it had run. After a prompt's last prefill chunk (``ForwardBinding``), the
run asks onnxruntime to shrink its arena (``shrink_options``) and glibc's
``malloc_trim(0)`` hands the heap's free pages back (``trim_heap``); decode steps do
neither. Measured at no cost on decode steps or on a 2,000-token prefill
(docs/benchmarks.md, "Memory over a long run"); trimming after every chunk instead cost
the prefill 7% on a busy machine (0.933x), each chunk faulting in again what the one
before had given back."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import onnxruntime as ort

#: onnxruntime's run option that frees the CPU arena's regions no tensor uses any more at
#: the end of a run (its first region stays)
SHRINK_KEY = "memory.enable_memory_arena_shrinkage"


@functools.cache
def shrink_options() -> ort.RunOptions:
    """Run options that shrink the CPU arena after the run (made once, shared)."""
    options = ort.RunOptions()
    options.add_run_config_entry(SHRINK_KEY, "cpu:0")
    return options


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
