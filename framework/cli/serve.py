"""``ortgen serve``: the model over an OpenAI-compatible HTTP API (``ortgen.serve``)."""

from __future__ import annotations

import argparse

from ..errors import OrtgenError
from .args import add_model_flags, component_spec


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models over an OpenAI-compatible HTTP API")
    add_model_flags(p, several=True)
    p.add_argument(
        "--models-dir",
        metavar="DIR",
        help="serve every model folder in DIR too, each by its folder's name",
    )
    p.add_argument(
        "--max-loaded",
        type=int,
        default=4,
        metavar="N",
        help="models loaded at once; past it the least recently used is unloaded "
        "(default 4; 0: no limit)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument("--max-batch", type=int, default=8, help="rows decoded together (default 8)")
    p.add_argument("--max-queue", type=int, default=64, help="rows waiting, then 429 (default 64)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' ($ORTGEN_API_KEY)")
    p.add_argument("--grace", type=float, default=10.0, help="SIGTERM: seconds to finish (10)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest body (1 MiB)")
    p.add_argument(
        "--cache",
        dest="cache_spec",
        metavar="NAME[:key=value,...]",
        help="the KV cache every row shares: a cache plugin with the RowSlots capability "
        "(default: slots on fused graphs, concat_slots on optimum graphs)",
    )
    p.add_argument(
        "--files-dir",
        metavar="DIR",
        help="turn on OpenAI's Files and Batches API (/v1/files, /v1/batches), keeping "
        "files and batches in DIR (made if missing; a restarted server lists them)",
    )
    p.add_argument(
        "--no-web", action="store_true", help="no chat page at / (the API stays under /v1)"
    )
    p.add_argument(
        "--no-prefix-sharing",
        action="store_true",
        help="prefill every prompt whole, not from a prefix another request left",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="serve as Ray Serve replicas behind Ray Serve's proxy at --host/--port: on "
        "the Ray cluster at ADDRESS, or a Ray of its own on 127.0.0.1 (needs 'ortgen[ray]')",
    )
    p.add_argument(
        "--replicas", type=int, default=1, metavar="N", help="with --ray: replicas (default 1)"
    )
    p.add_argument(
        "--keep-memory",
        action="store_true",
        help="keep freed memory for reuse instead of giving it back after long prompts "
        "and when idle (onnxruntime's CPU arena on, glibc's per-thread arenas, every "
        "slot's prompt kept: RSS then stays at the largest requests served)",
    )
    p.set_defaults(func=cmd_serve, one_shot=False)  # a server: it drains, then exits


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        if args.ray is not None:
            from ..serve.ray_serve import main as serve
        else:
            from ..serve.server import main as serve
    except ImportError as exc:
        raise OrtgenError(f"ortgen serve needs {exc.name}: pip install 'ortgen[serve]'") from exc
    if args.ray is None and args.replicas != 1:
        raise OrtgenError("--replicas needs --ray (replicas are Ray Serve's)")
    if args.ray is not None and getattr(args, "files_dir", None) is not None:
        raise OrtgenError(
            "--files-dir is not served with --ray: each replica would run the folder's "
            "batches (run the Files and Batches API on one ortgen serve without --ray)"
        )
    args.cache = None
    if args.cache_spec:
        spec = component_spec(args.cache_spec)
        args.cache = (spec.pop("name"), spec)
    return serve(args)
