"""The Ray Serve half of ``ortgen serve --ray``: a replica of the app ``ortgen serve``
builds, and the hub its replicas share.

A replica is the single-process server without uvicorn: it builds the same
:class:`~ortgen.serve.state.ServerState` from the same flags (``server.build_state``: its
own models, engines and continuous batch) and the same Starlette app
(``app.build_app``), which Ray Serve runs behind its HTTP proxy (``@serve.ingress()``
with ``__serve_build_asgi_app__``: the app is built on the replica, after the models
load; Serve runs its lifespan, which starts and stops the engines). Routes, API key,
errors, SSE and the 503s of a drain are therefore the single-process server's own.

What no replica can do alone goes through :class:`ReplicaHub`, one small actor of the
application: each replica reports its metrics and requests in flight about once a second
and gets the others' back (``replica_metrics``), and the drain the driver starts on
SIGTERM reaches every replica at once (a report waits on the hub until the next one is
due or a drain begins).

Imported only by ``ray_serve.main``, after it has checked that Ray Serve is installed
(this module imports it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.applications import Starlette

from ..util.ray_cluster import LOOPBACK
from .app import build_app
from .replica_metrics import Report, registry
from .server import build_state

log = logging.getLogger("ortgen.serve")


def _bind_replica_grpc_to_loopback() -> None:
    """Ray Serve 2.60 binds every replica's inter-deployment gRPC server to every
    interface (``"[::]:0"`` in ``ray.serve._private.replica``'s ``_on_initialized``),
    whatever the node's address. On a node whose address is the loopback one (the Ray
    ``ortgen serve --ray`` starts for itself, a cluster started with
    ``--node-ip-address 127.0.0.1``) this binds it to 127.0.0.1 instead, so that node
    listens on 127.0.0.1 only; elsewhere Ray's own choice stands. It runs in each replica
    when the replica's class is unpickled there, which imports this module."""
    import ray
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def loopback_bind(server: Any, address: str) -> int:
        if address == "[::]:0" and ray.util.get_node_ip_address() == LOOPBACK:
            address = f"{LOOPBACK}:0"
        return int(bind(server, address))

    if getattr(bind, "__name__", "") != "loopback_bind":
        replica.add_port_to_grpc_server = loopback_bind


_bind_replica_grpc_to_loopback()

#: seconds between a replica's reports; a report older than STALE is a replica gone
INTERVAL = 1.0
STALE = 5 * INTERVAL


class _Hub:
    """The replicas' last reports, and the drain."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, Report]] = {}
        self.grace: float | None = None
        self._drain = asyncio.Event()

    async def exchange(self, report: Report) -> tuple[list[Report], float | None]:
        """Keep ``report``; after INTERVAL (at once when a drain begins that the replica
        does not know of), the other replicas' reports and the drain's grace (None: no
        drain)."""
        self.reports[report.replica] = (time.monotonic(), report)
        if report.draining:
            await asyncio.sleep(INTERVAL)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drain.wait(), INTERVAL)
        return [r for r in self._fresh() if r.replica != report.replica], self.grace

    def drain(self, grace: float) -> None:
        """SIGTERM on the driver: every replica refuses new requests (503) and gives
        those in flight ``grace`` seconds."""
        self.grace = grace
        self._drain.set()

    def status(self) -> list[tuple[str, int, bool]]:
        """(replica, requests in flight, draining) of each replica that reports."""
        return [(r.replica, r.in_flight, r.draining) for r in self._fresh()]

    def _fresh(self) -> list[Report]:
        now = time.monotonic()
        for replica, (at, _) in list(self.reports.items()):
            if now - at > STALE:
                del self.reports[replica]
        return [report for _, report in self.reports.values()]


#: the hub's deployment; the class stays importable by name, so a replica unpickles it by
#: reference and imports this module (and its loopback bind) first
ReplicaHub = serve.deployment(
    name="ReplicaHub",
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=10_000,  # every replica's report waits here for up to INTERVAL
    graceful_shutdown_timeout_s=2 * INTERVAL,
    graceful_shutdown_wait_loop_s=0.2,
)(_Hub)


@serve.ingress()
class _Replica:
    """One replica: the single-process server's state and app."""

    def __init__(self, args: argparse.Namespace, hub: DeploymentHandle) -> None:
        self.state = build_state(args)  # the models load here: a bad one fails the deploy
        self.hub = hub
        self.id = serve.get_replica_context().replica_id.unique_id
        self.others: list[Report] = []
        self._draining: asyncio.Task[None] | None = None
        self._reporting: asyncio.Task[None] | None = None

    def __serve_build_asgi_app__(self) -> Starlette:
        app = build_app(self.state)
        self.own = app.state.metrics
        app.state.metrics = registry(self.own, self.id, lambda: self.others)
        self._reporting = asyncio.get_running_loop().create_task(self._report())
        return app

    async def _report(self) -> None:
        """Report to the hub until the replica stops; start the drain when it says so."""
        while True:
            report = Report(
                self.id,
                list(self.own.collect()),
                self.state.http.in_flight,
                draining=self._draining is not None,
            )
            try:
                self.others, grace = await self.hub.exchange.remote(report)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the hub restarting: try again
                log.warning("ortgen serve: the replica hub did not answer: %s", exc)
                await asyncio.sleep(INTERVAL)
                continue
            if grace is not None and self._draining is None:
                self._draining = asyncio.create_task(self.state.drain(grace))

    def served(self) -> list[str]:
        """The model ids this replica serves (the first is the default)."""
        return list(self.state.models.sources)

    def check_health(self) -> None:
        """Ray Serve replaces a replica whose decode loop has stopped: nothing queued on
        it would ever run (the single-process server's /health says 503 then)."""
        dead = [model.id for model in self.state.models.loaded() if not model.engine.alive]
        if dead:
            raise RuntimeError(f"the decode loop of {', '.join(dead)} stopped")

    def __del__(self) -> None:
        task = getattr(self, "_reporting", None)
        if task is not None:
            task.cancel()


#: the deployment (its name is in each replica's actor name: SERVE_REPLICA::ortgen#OrtgenReplica#ID)
OrtgenReplica = serve.deployment(name="OrtgenReplica")(_Replica)


def application(args: argparse.Namespace, replicas: int, threads: int) -> Any:
    """The application ``serve.run`` deploys: ``replicas`` replicas of ``threads`` CPUs
    each (onnxruntime's intra-op threads), and the hub."""
    return OrtgenReplica.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": threads},
        # ortgen's own queue decides (429 past --max-queue), not a Serve limit before it
        max_ongoing_requests=args.max_batch + args.max_queue,
        # Serve's own stop waits for what is in flight; the driver's drain came first
        graceful_shutdown_timeout_s=args.grace + 10,
        graceful_shutdown_wait_loop_s=0.2,
    ).bind(args, ReplicaHub.bind())
