"""Joining a Ray cluster, or starting one for this machine only: what ``ortgen run
--engine ray`` and ``ortgen serve --ray`` share.

Ray is never imported here: the caller passes the module it got from :func:`require`, so
ortgen imports without Ray, and an application without it fails with one line naming the
extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
from typing import Any

from ..errors import OrtgenError

#: a Ray instance ortgen starts for itself serves this machine only: its node (GCS,
#: raylet, object store, workers, agents) has the loopback address, and no dashboard
LOOPBACK = "127.0.0.1"
LOOPBACK_ONLY: dict[str, Any] = {
    "_node_ip_address": LOOPBACK,
    "include_dashboard": False,
    "dashboard_host": LOOPBACK,
}
#: what ``ray.init`` is told so that Ray's own logging stays out of ortgen's output
QUIET: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}


def ray_available() -> bool:
    """Whether Ray is installed, without importing it (a dry run only checks)."""
    return importlib.util.find_spec("ray") is not None


def require(part: str, needed_by: str) -> Any:
    """The ``ray`` module with ``ray.<part>`` imported (``data``, ``serve``: ray's own
    extras, which may be missing even when ray is there), or an error naming ortgen's
    ``ray`` extra."""
    try:
        import ray

        importlib.import_module(f"ray.{part}")
    except ImportError:
        raise OrtgenError(
            f"{needed_by} needs Ray ({'ray[' + part + ']'}), which is not installed: "
            "pip install 'ortgen[ray]'"
        ) from None
    return ray


def connect(ray: Any, address: str | None, cpus: int) -> bool:
    """Join the cluster at ``address``, or start a local instance of ``cpus`` CPUs; True
    when this call started Ray (so the caller shuts it down), False when the process had
    already joined one."""
    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, **QUIET)
        except (ConnectionError, RuntimeError) as exc:
            raise OrtgenError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
    else:
        start_local(ray, cpus)
    return True


def start_local(ray: Any, cpus: int) -> None:
    """A Ray instance of ortgen's own, listening on the loopback address only.

    ``_node_ip_address`` is how ``ray.init`` names the node's address, but Ray 2.60 turns a
    loopback address into the machine's interface address whenever clusters are enabled
    (``ray._private.services.resolve_ip_for_localhost``; they are, on Linux), and the GCS,
    raylet, workers and agents then listen on that interface or on every one (measured:
    ``gcs_server`` and ``raylet`` on ``::``, the runtime-env agent on the interface
    address). With clusters off (what ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets when Ray
    is imported) it keeps the loopback address and every one of them listens there, so
    that switch is off while this instance starts. The node's address is checked after:
    a Ray that chose another one is stopped and refused."""
    constants: Any = importlib.import_module("ray._private.ray_constants")
    clusters = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", num_cpus=cpus, **LOOPBACK_ONLY, **QUIET)
    finally:
        constants.ENABLE_RAY_CLUSTER = clusters
    addresses = {node.get("NodeManagerAddress") for node in ray.nodes()}
    if addresses != {LOOPBACK}:
        ray.shutdown()
        raise OrtgenError(
            f"the local Ray instance took the address {', '.join(map(str, addresses))}, not "
            f"{LOOPBACK}: ortgen starts Ray for this machine only. Start a Ray cluster "
            "yourself (ray start --head) and give its address"
        )


def check_room(ray: Any, count: int, cpus: float, what: str, flags: str) -> None:
    """``count`` actors of ``cpus`` CPUs each that the cluster cannot hold would wait
    forever: say so instead (``what``: workers, replicas; ``flags``: what to lower)."""
    total = ray.cluster_resources().get("CPU", 0.0)
    if count * cpus > total:
        raise OrtgenError(
            f"{count} {what} of {cpus:g} CPUs each need {count * cpus:g} CPUs; the Ray "
            f"cluster has {total:g}: use fewer {flags}"
        )


#: the last line of a worker's traceback when it raised an ortgen error
_ORTGEN_ERROR_LINE = re.compile(r"^ortgen\.errors\.\w+: (.+)$", re.MULTILINE)


def ortgen_error_in(exc: BaseException, *texts: str) -> OrtgenError | None:
    """The ortgen error a Ray worker or replica raised, out of what Ray wrapped it in:
    the error itself when Ray kept it, else its text (an actor that failed to start
    keeps only its traceback's text; ``texts``: where else that text may be, e.g. Serve's
    status messages); None when it was no ortgen error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OrtgenError):
            return current
        current = getattr(current, "cause", None) or current.__cause__ or current.__context__
    said = _ORTGEN_ERROR_LINE.findall("\n".join([str(exc), *texts]))
    if said:
        return OrtgenError(f"on a Ray worker: {said[-1]}")
    return None
