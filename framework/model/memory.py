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
before had given back.

``ortgen serve`` goes further (not ``--keep-memory``): its model runs without
onnxruntime's CPU arena (``ortgen.load(memory_arena=False)``) and every thread allocates
from glibc's main heap (``one_heap``). The arena's shrink frees only regions no tensor
uses, and a small tensor still alive (an output a binding holds) kept a region of tens
of MiB; a thread arena's top is not trimmed by ``malloc_trim``. Idle after 40 mixed
requests, that was 352-398 MiB in four runs (1.38-1.56x the RSS after the first
request) against 322 (1.27x) without both. Decode measured within the noise of a shared
machine (medians of 6-7 runs: 1.007x at 1 thread, 0.999x at 2), a 2,000-token prefill
2-3% slower (0.972x, 0.983x): ``benchmarks/ab_settings.py``; docs/benchmarks.md,
"Memory over a long run"."""

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
def _glibc(name: str, *argtypes: type) -> Callable[..., int] | None:
    """glibc's function ``name`` taking ``argtypes`` and returning an int (None where
    the C library has none: musl, macOS, Windows)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the C library cannot."""
    trim = _glibc("malloc_trim", ctypes.c_size_t)
    if trim is None:
        return False
    trim(0)
    return True


#: glibc's ``mallopt`` parameter for the most arenas (malloc.h)
M_ARENA_MAX = -8


def one_heap() -> bool:
    """Make every thread allocate from glibc's main heap (``M_ARENA_MAX`` 1); False
    where the C library has no such setting. Call it before threads start.

    A thread's own arena (glibc gives the engine thread one) is trimmed at its top only
    when a ``free`` leaves more than the trim threshold there, and that threshold rises
    with the largest block freed (to 64 MiB), so a server's engine arena stayed at the
    longest prompt's temporaries; ``malloc_trim(0)`` trims the main heap's top too.
    """
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and mallopt(M_ARENA_MAX, 1) == 1
