"""``ortgen export SOURCE OUT`` (a GGUF file or a HF folder) and ``ortgen export --default``.

A GGUF file goes through ortgen's own builder (``ortgen.gguf``: no extra needed); a
Hugging Face folder, or a GGUF re-quantised (``--precision int4``/``int8``) or exported as
an optimum graph, through the ``export`` extra (torch, transformers, optimum,
onnxruntime-genai), which is checked before anything is read or downloaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import OrtgenError
from ..export.variant import GRAPHS, PRECISIONS

#: precisions of ortgen's GGUF builder: the file's own weights, or all of them as float32
BUILDER_PRECISIONS = ("exact", "fp32")


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="build a model folder from a GGUF file or a HF folder")
    p.add_argument("source", nargs="?", help=".gguf file or Hugging Face model folder")
    p.add_argument("out", nargs="?", help="output model folder")
    p.add_argument("--default", action="store_true", help="build the default model")
    p.add_argument("--models-dir", help="where --default puts it (default: exported_models/)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    p.add_argument("--force", action="store_true", help="with --default: rebuild even if current")
    p.add_argument("--graph", choices=GRAPHS, help="graph family (default: fused)")
    p.add_argument(
        "--precision",
        choices=(*BUILDER_PRECISIONS, *(p for p in PRECISIONS if p != "fp32")),
        help="weights: a GGUF's own (exact, the default for .gguf), fp32, or re-quantised "
        "int8/int4 (the default for a HF folder; needs the export extra)",
    )
    p.add_argument("--block-size", type=int, help="weights per quantisation block (default 32)")
    p.add_argument(
        "--accuracy-level", type=int, help="MatMulNBits activations: 4 = int8 (default), 0 = fp32"
    )
    p.add_argument(
        "--max-context", type=int, help="positions the graph serves (GGUF; default: the file's, "
        "up to 32768)"
    )  # fmt: skip
    p.add_argument(
        "--embeddings", action="store_true", help="also output the last hidden state "
        "(gen.embed(), POST /v1/embeddings; any SOURCE and graph)"
    )  # fmt: skip
    p.set_defaults(func=cmd_export, one_shot=False)  # files being written: a normal exit


def cmd_export(args: argparse.Namespace) -> int:
    from ..gguf.cache import stderr_progress
    from ..model.locate import is_gguf_path
    from ..model.paths import models_dir

    if args.default:
        from ..gguf.default_model import build_default_model

        chosen = (args.graph, args.precision, args.block_size, args.accuracy_level)
        if any(value is not None for value in chosen) or args.max_context or args.embeddings:
            raise OrtgenError(
                "--default builds the default variant; --graph/--precision/--block-size/"
                "--accuracy-level/--max-context/--embeddings apply to `ortgen export SOURCE OUT`"
            )
        where = Path(args.models_dir) if args.models_dir else models_dir()
        build_default_model(where, progress=stderr_progress, force=args.force)
        return 0
    if not args.source or not args.out:
        raise OrtgenError("ortgen export needs SOURCE and OUT (or --default)")
    source, out = Path(args.source), Path(args.out)
    if (
        is_gguf_path(source)
        and args.graph in (None, "fused")
        and args.block_size is None
        and (args.precision in (None, *BUILDER_PRECISIONS))
    ):
        return _build_gguf(args, source, out)
    return _export_with_extra(args)


def _build_gguf(args: argparse.Namespace, source: Path, out: Path) -> int:
    from ..gguf.build import build_folder
    from ..gguf.cache import file_sha256, stderr_progress
    from ..gguf.options import BuildOptions

    if out.exists() and not args.overwrite:
        raise OrtgenError(f"{out} exists; pass --overwrite to replace it")
    options = BuildOptions(
        precision=args.precision or "exact",
        accuracy_level=4 if args.accuracy_level is None else args.accuracy_level,
        max_context=args.max_context,
        embeddings=args.embeddings,
    )
    build_folder(source, out, options=options, sha256=file_sha256(source), progress=stderr_progress)
    stderr_progress(f"built {out}")
    return 0


def _export_with_extra(args: argparse.Namespace) -> int:
    from ..plugin_host.installed import export_extra_missing, install_command

    missing = export_extra_missing()
    if missing:
        what = "a Hugging Face folder" if Path(args.source).is_dir() else "with these options"
        raise OrtgenError(
            f"exporting {args.source} ({what}) needs the export extra "
            f"({', '.join(missing)} missing): {install_command('export')}"
        )
    from ..export import DEFAULT_VARIANT, Variant, export_model, print_progress

    variant = Variant(
        graph=args.graph or DEFAULT_VARIANT.graph,
        precision=args.precision
        if args.precision not in (None, "exact")
        else DEFAULT_VARIANT.precision,
        block_size=args.block_size or DEFAULT_VARIANT.block_size,
        accuracy_level=(
            DEFAULT_VARIANT.accuracy_level if args.accuracy_level is None else args.accuracy_level
        ),
        embeddings=args.embeddings,
    )
    export_model(
        args.source, args.out, variant=variant, progress=print_progress, overwrite=args.overwrite
    )
    return 0
