"""``ortgen export SOURCE OUT`` (a HF folder or a GGUF file) and ``ortgen export --default``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import OrtgenError
from ..export.variant import GRAPHS, PRECISIONS


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a HF folder or GGUF file to an ortgen model folder")
    p.add_argument("source", nargs="?", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", nargs="?", help="output model folder")
    p.add_argument("--default", action="store_true", help="build the default model")
    p.add_argument("--models-dir", help="where --default puts it (default: exported_models/)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    p.add_argument("--force", action="store_true", help="with --default: rebuild even if current")
    p.add_argument("--graph", choices=GRAPHS, help="graph family (default: fused)")
    p.add_argument("--precision", choices=PRECISIONS, help="weights (default: int4)")
    p.add_argument("--block-size", type=int, help="weights per quantisation block (default 32)")
    p.add_argument(
        "--accuracy-level", type=int, help="MatMulNBits activations: 4 = int8 (default), 0 = fp32"
    )
    p.set_defaults(func=cmd_export, one_shot=False)  # files being written: a normal exit


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import DEFAULT_VARIANT, Variant, export_model, print_progress
    from ..export.default_model import build_default_model
    from ..paths import models_dir

    if args.default:
        chosen = (args.graph, args.precision, args.block_size, args.accuracy_level)
        if any(value is not None for value in chosen):
            raise OrtgenError(
                "--default builds the default variant; --graph/--precision/--block-size/"
                "--accuracy-level apply to `ortgen export SOURCE OUT`"
            )
        where = Path(args.models_dir) if args.models_dir else models_dir()
        build_default_model(where, progress=print_progress, force=args.force)
        return 0
    if not args.source or not args.out:
        raise OrtgenError("ortgen export needs SOURCE and OUT (or --default)")
    variant = Variant(
        graph=args.graph or DEFAULT_VARIANT.graph,
        precision=args.precision or DEFAULT_VARIANT.precision,
        block_size=args.block_size or DEFAULT_VARIANT.block_size,
        accuracy_level=(
            DEFAULT_VARIANT.accuracy_level if args.accuracy_level is None else args.accuracy_level
        ),
    )
    export_model(
        args.source, args.out, variant=variant, progress=print_progress, overwrite=args.overwrite
    )
    return 0
