"""What differs between a request's own batch and an open batch, in one object.

A request's batch (``Generation(...)``) has its rows from the start: they are prefilled
together in its first step, sit at one place in the buffer, and end the request together;
a component's error is raised to the caller. An open batch (``Generation.open()``, the
server's) starts empty: rows join (prefilled alone in ``admit()``) and leave, each at its
own place, the buffer grows as they need, and a component's error ends only its row. The
loop reads the behaviour it needs from this object, by name, instead of branching on one
flag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchKind:
    """The behaviours that tell the two kinds of batch apart."""

    name: str
    #: rows join with ``admit()`` (prefilled there) and leave with ``release()``; no
    #: ``append()``/``rewind()`` of the whole batch
    joins: bool
    #: the buffer grows as rows need; else its end is the request's length limit
    grows: bool
    #: a component's error ends only the rows it serves; else it is raised to the caller
    isolates_errors: bool


REQUEST = BatchKind("request", joins=False, grows=False, isolates_errors=False)
OPEN = BatchKind("open batch", joins=True, grows=True, isolates_errors=True)
