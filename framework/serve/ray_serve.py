"""``ortgen serve --ray [ADDRESS] --replicas N``: the app ``ortgen serve`` builds, as N
Ray Serve replicas behind Ray Serve's HTTP proxy.

This process is the driver: it checks the flags and the models (a typo fails here, not
in N replicas), joins the cluster at ADDRESS or starts a Ray of its own on 127.0.0.1
(``util.ray_cluster``, as ``ortgen run --engine ray`` does), starts Serve with its proxy
at ``--host``/``--port``, deploys the application (``ray_replica``: each replica loads its
own models and runs its own engines), prints the URL line ``ortgen serve`` prints, and
waits for a signal.

SIGTERM or SIGINT drains as the single-process server does, on every replica at once:
new requests get 503, those in flight get ``--grace`` seconds (then the replicas cancel
what is left); once every replica reports none in flight, the application is deleted
(and Serve shut down when nothing else runs on it, and the Ray this process started).
A second signal skips the wait.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import OrtgenError
from ..plugin_host.manager import import_plugin
from ..util import ray_cluster
from .model_sources import model_sources
from .server import check_flags

#: the application's name on the cluster's Serve
APP = "ortgen"


def main(args: argparse.Namespace) -> int:
    """Serve on Ray until SIGTERM/SIGINT; 0 after a clean drain."""
    ray = ray_cluster.require("serve", "ortgen serve --ray")
    check_flags(args)
    if args.replicas < 1:
        raise OrtgenError(f"--replicas must be at least 1, got {args.replicas}")
    if args.threads is not None and args.threads < 1:
        raise OrtgenError(f"--threads must be at least 1, got {args.threads}")
    # this machine's cores shared out, unless told: each replica reserves its threads
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.replicas)
    replica_args = _replica_args(args, threads)
    port = args.port or _free_port(args.host)
    from ray import serve

    from . import ray_replica  # imports ray.serve

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    started = ray_cluster.connect(
        ray, args.ray or None, max(os.cpu_count() or 1, args.replicas * threads)
    )
    signals = _Signals()  # after ray.init, which installs a SIGTERM handler of its own
    deployed = False
    try:
        what = "--replicas or --threads"
        ray_cluster.check_room(ray, args.replicas, threads, "replicas", what)
        _start_serve(serve, args.host, port)
        if APP in serve.status().applications:
            raise OrtgenError(
                f"an application called {APP!r} already runs on this cluster's Ray Serve "
                "(another `ortgen serve --ray`?): stop it first (serve.delete)"
            )
        application = ray_replica.application(replica_args, args.replicas, threads)
        deployed = True
        handle = _deploy(serve, application)
        served = handle.served.remote().result()
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"ortgen serve: {', '.join(served)} at http://{shown}:{port}/v1", flush=True)
        print(
            f"ortgen serve: {args.replicas} Ray Serve replica(s) of {threads} thread(s)",
            file=sys.stderr,
            flush=True,
        )
        signals.wait(1)
        print("ortgen serve: draining", file=sys.stderr, flush=True)
        _drain(serve, args.grace, signals)
    finally:
        if deployed:
            _remove(serve)
        if started:
            ray.shutdown()
    print("ortgen serve: stopped", file=sys.stderr, flush=True)
    return 0


def _replica_args(args: argparse.Namespace, threads: int) -> argparse.Namespace:
    """The flags as a replica reads them: paths that mean the same on a worker (whose
    current directory is not ours), the models and plugins already checked (and GGUF
    files built), the API key resolved here (a worker has not our environment)."""
    sources = model_sources(args.model or [], args.models_dir)
    given = {k: v for k, v in vars(args).items() if k not in ("func", "ray", "replicas")}
    plugins = [
        str(Path(spec).expanduser().resolve())
        if spec.endswith(".py") or "/" in spec or os.sep in spec
        else spec
        for spec in args.plugin
    ]
    for spec in plugins:  # one that cannot import fails here, as on the single server
        import_plugin(spec)
    pipeline = str(Path(args.pipeline).expanduser().resolve()) if args.pipeline else None
    return argparse.Namespace(
        **{
            **given,
            "model": [f"{source.id}={source.path}" for source in sources],
            "models_dir": None,
            "plugin": plugins,
            "pipeline": pipeline,
            "threads": threads,
            "api_key": args.api_key or os.environ.get("ORTGEN_API_KEY") or None,
        }
    )


def _free_port(host: str) -> int:
    """``--port 0``: a port free here now, for Serve's proxy (Serve takes a fixed port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise OrtgenError(f"cannot listen on {host}: {exc.strerror or exc}") from None
        return int(sock.getsockname()[1])


def _start_serve(serve: Any, host: str, port: int) -> None:
    """Serve with its proxy at ``host:port``; an error when Serve already runs on the
    cluster with its proxy elsewhere (Serve fixes its HTTP options when it starts)."""
    serve.start(http_options={"host": host, "port": port})
    from ray.serve.context import _get_global_client  # what serve.start itself checks

    client = _get_global_client()
    if client is None:  # serve.start has just made one: never None here
        raise OrtgenError("Ray Serve did not start")
    config = client.http_config
    if (config.host, config.port) != (host, port):
        raise OrtgenError(
            f"Ray Serve already runs on this cluster with its proxy at {config.host}:"
            f"{config.port}: give --host {config.host} --port {config.port}, or shut it "
            "down first (serve shutdown)"
        )


def _deploy(serve: Any, application: Any) -> Any:
    """Deploy and wait until every replica runs; a replica that cannot start (a plugin
    that fails there, a model it cannot load) is one ortgen error."""
    try:
        return serve.run(application, name=APP, route_prefix="/")
    except Exception as exc:
        cause = ray_cluster.ortgen_error_in(exc, *_status_messages(serve))
        if cause is not None:
            raise cause from None
        raise OrtgenError(f"Ray Serve could not deploy ortgen: {exc}") from exc


def _status_messages(serve: Any) -> list[str]:
    """What Serve says of the application and its deployments (a replica's traceback
    when it failed to start)."""
    try:
        app = serve.status().applications.get(APP)
    except Exception:  # Serve itself is gone: nothing more to read
        return []
    if app is None:
        return []
    return [app.message, *(deployment.message for deployment in app.deployments.values())]


def _drain(serve: Any, grace: float, signals: _Signals) -> None:
    """Every replica refuses new requests and finishes those in flight (``grace``
    seconds, then cancels them); return when none reports any left, a replica's
    report and the cancelling given their time, or at a second signal."""
    hub = serve.get_deployment_handle("ReplicaHub", app_name=APP)
    hub.drain.remote(grace).result()
    deadline = time.monotonic() + grace + 10
    while signals.count < 2 and time.monotonic() < deadline:
        status = hub.status.remote().result()
        if status and all(draining and in_flight == 0 for _, in_flight, draining in status):
            return
        time.sleep(0.2)


def _remove(serve: Any) -> None:
    """Delete the application, and Serve itself when nothing else runs on it."""
    serve.delete(APP)
    if not serve.status().applications:
        serve.shutdown()


class _Signals:
    """SIGTERM and SIGINT, counted (the driver acts on them in its own thread)."""

    def __init__(self) -> None:
        self.count = 0
        self._event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        self.count += 1
        self._event.set()

    def wait(self, count: int) -> None:
        while self.count < count:
            self._event.wait(0.2)
