"""GGUF files as users bring them: ortgen against llama.cpp on the same file, per type (issue 37).

The default GGUF (SmolLM2-135M-Instruct, Q4_1 as published) and llama.cpp's own
re-quantisations of it to Q4_K_M, Q5_K_M, Q6_K, Q8_0 and Q4_0 (``bash
benchmarks/setup_peers.sh`` makes them into ``benchmarks/.models/gguf/``). For each file:

1. **Build**: ``ortgen.gguf.cache.built_model`` (what ``ortgen.load(file)`` does on first
   use) in a fresh process, into this benchmark's own cache (``benchmarks/.models/gguf/
   cache``, via ``ORTGEN_MODELS_DIR``): wall time and peak RSS, and the file's type mix
   (tensors per GGUF type; llama.cpp picks each tensor's type itself).
2. **Quality**, teacher-forced over ``ortgen.bench.quality``'s evaluation text (the same
   ids for both engines, from ortgen's tokenizer): ortgen as a user loads the file
   (default options: exact weights, MatMulNBits accuracy level 4) one token per forward,
   llama.cpp through ``benchmarks/engines/run_llama_cpp.py --eval-ids`` (all logits in one
   evaluation); the share of positions where the two top-1 tokens agree (goal >= 0.97),
   and each engine's perplexity. ``--variants a0 fp32`` also scores ortgen built at
   accuracy level 0 (float activations) and with every weight dequantised to float32 (the
   file's network in float arithmetic), and gives every engine's agreement with the latter:
   where the default misses 0.97, this says whose rounding it is.
3. **Decode speed** at each thread count, ortgen (``ortgen bench --model FILE.gguf``
   through ``engines/run_ortgen.py``: the timed process loads the GGUF path itself) and
   llama.cpp (``engines/run_llama_cpp.py``) on the same file: compare.py's method
   (docs/benchmarks.md): round-robin rounds (the order rotates, and the two engines of a
   file swap places every other round), a fresh process per run, the same prompt ids for
   both (``ortgen bench``'s default: the evaluation text's first 38 tokens; ``--chat-prompt``:
   compare.py's 39-token chat prompt), 128 greedy tokens with EOS ignored; medians, and each
   run's peak RSS (the process's ``ru_maxrss``: loading included). Goal: ortgen /
   llama.cpp >= 1.0x on every type, >= 1.2x on the 4-bit ones (Q4_0, Q4_1, Q4_K_M), at 1
   and 2 threads.
4. **Bytes and nodes** (what bounds a ratio): the weight bytes ortgen's graph reads per
   decode step (MatMulNBits B + scales + zero points + bias, the minimum tables, one row
   of each embedding table, one row of the rotary caches, the norms), with the block-sum
   rows the minimum terms add counted apart, against what llama.cpp reads (every tensor
   of the file, the tied embedding in full as the LM head); per GGUF type, bits per weight
   in the file against ortgen's exact layout; nodes per decode step in the graph as
   written and as onnxruntime runs it (after its graph optimisations), and llama.cpp's
   graph node count.

    .venv/bin/python benchmarks/gguf.py [--types Q4_1 Q4_K_M ...] [--rounds 3]
        [--threads 1 2] [--new-tokens 128] [--prompt-tokens 38 | --chat-prompt]
        [--eval-tokens N] [--variants a0 fp32] [--reuse-builds] [--no-quality]
        [--no-speed] [--no-llama] [--gguf-dir DIR]

Everything that loads a model runs in a fresh process, the byte and node analysis too
(``--analyse``): a child's ``ru_maxrss`` starts from its parent's resident size, so this
process stays small and each timed run's peak RSS is its engine's own.

Writes benchmarks/results/gguf-<timestamp>.json and .md. Timings are ratios measured in one
run: on a busy machine both engines slow down, so read the ratios, not the tok/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _hand_over_to_gguf_py() -> None:
    """This file is named gguf.py: a script of this folder (its folder first on sys.path)
    that imports gguf-py, directly or through ortgen's builder or transformers, finds this
    file. Put gguf-py in its place in ``sys.modules``: the import returns that instead."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    del sys.modules["gguf"]
    try:
        sys.modules["gguf"] = importlib.import_module("gguf")
    finally:
        sys.path[:] = saved


if __name__ == "gguf":
    _hand_over_to_gguf_py()
elif __name__ == "__main__" and sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)  # run as a script: ``import gguf`` below must find gguf-py, not this file

ROOT = HERE.parent
MODELS = HERE / ".models"
GGUF_DIR = MODELS / "gguf"  # setup_peers.sh makes the files here; builds go to its cache/
RESULTS = HERE / "results"
ENGINES_DIR = HERE / "engines"
MAIN_PY = ROOT / ".venv" / "bin" / "python"
PEERS_PY = HERE / ".venv-peers" / "bin" / "python"
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
#: the types whose ratio goal is 1.2x (4-bit files)
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K_M")
LLAMA, ORTGEN = "llama.cpp", "ortgen"


def _load_sibling(name: str) -> Any:
    """A module of this folder by path (this folder is not on sys.path, see above)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


compare = _load_sibling("compare")
gguf_files = _load_sibling("gguf_files")


def log(message: str) -> None:
    print(f"[gguf] {message}", flush=True)


def gguf_path(kind: str, args: argparse.Namespace) -> Path:
    """``kind``'s file in ``--gguf-dir``."""
    return Path(args.gguf_dir) / gguf_files.file_name(kind)


def cache_dir(args: argparse.Namespace) -> Path:
    """The benchmark's own build cache (``ORTGEN_MODELS_DIR`` of every process it starts)."""
    return Path(args.gguf_dir) / "cache"


def run_json(command: list[str], timeout: float, env: dict[str, str] | None = None) -> dict | str:
    """Run ``command``; its last JSON line, or why not (exit status and stderr's tail)."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    result = compare.parse_result(done.stdout) if done.returncode == 0 else None
    if result is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"exit {done.returncode}: " + " | ".join(tail)
    return result


# -- 1. build --------------------------------------------------------------------------------

_BUILD = """
import json, resource, sys, time
start = time.perf_counter()
from ortgen.gguf.cache import built_model
imported = time.perf_counter()
folder = built_model(sys.argv[1])
done = time.perf_counter()
print(json.dumps({
    "folder": str(folder), "import_s": imported - start, "build_s": done - imported,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def build(kind: str, args: argparse.Namespace) -> dict | str:
    """Build one file into the benchmark's cache in a fresh process (an earlier build of it
    is removed first unless ``--reuse-builds``: a reused build has no build time)."""
    path = gguf_path(kind, args)
    if not args.reuse_builds:
        for old in (cache_dir(args) / ".gguf").glob(f"{path.stem}-*"):
            if old.is_dir():
                shutil.rmtree(old)
    return run_json([args.main_python, "-c", _BUILD, str(path)], args.timeout)


def type_mix(path: Path) -> dict[str, Any]:
    """Tensors per GGUF type (count and bytes), and which type each role got."""
    import gguf

    reader = gguf.GGUFReader(path)
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    roles: dict[str, Counter[str]] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        count[kind] += 1
        size[kind] += int(tensor.n_bytes)
        parts = tensor.name.split(".")
        role = ".".join(parts[2:]) if parts[0] == "blk" else tensor.name
        roles.setdefault(role, Counter())[kind] += 1
    return {
        "tensors": dict(count.most_common()),
        "bytes": dict(size.most_common()),
        "roles": {role: dict(kinds) for role, kinds in roles.items()},
        "file_bytes": path.stat().st_size,
    }


def mix_label(mix: dict[str, Any]) -> str:
    """``Q5_0 150, Q6_K 30, ...`` (weight tensors; the F32 norm vectors left out)."""
    return ", ".join(f"{k} {n}" for k, n in mix["tensors"].items() if k != "F32")


# -- 2. quality ------------------------------------------------------------------------------

_PREPARE = """
import json, sys
import ortgen
from ortgen.bench.quality import eval_ids
gen = ortgen.load(sys.argv[1], threads=1)
text = [int(i) for i in eval_ids(gen)]
messages, prompt_tokens, count = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompt = gen.chat_prompt(messages) if messages else text[:prompt_tokens]
print(json.dumps({"prompt": [int(i) for i in prompt], "eval": text[: count or None]}))
"""

_ORTGEN_SCORES = """
import json, sys
import ortgen
from ortgen.bench.quality import eval_ids, score_tokens
from ortgen.gguf.cache import built_model
from ortgen.gguf.options import BuildOptions
options = json.loads(sys.argv[4])
# the default variant is loaded as a user loads the file; the others built with options
target = built_model(sys.argv[1], options=BuildOptions(**options)) if options else sys.argv[1]
gen = ortgen.load(target, threads=int(sys.argv[3]))
ids = json.loads(open(sys.argv[2]).read())
scores = score_tokens(gen, ids)
print(json.dumps({
    "perplexity": scores.perplexity, "top1": scores.top1.tolist(),
    "same_eval_ids": eval_ids(gen)[: len(ids)] == ids,
}))
"""

#: ortgen builds scored besides the default (``--variants``): MatMulNBits at accuracy level 0
#: (float activations, the same exact weights), and every weight dequantised to float32 (the
#: file's own network in float arithmetic: a reference both engines are compared with). a0
#: is slow on files with 8-bit layouts (Q5_*, Q6_K, Q8_0, and the default file's Q8_0 head):
#: onnxruntime 1.32's 8-bit MatMulNBits at level 0 runs a fallback, ~5 ms a call against
#: ~0.2 ms at level 4 (576 x 1536, 1 thread, measured 2026-12-04 on a busy machine), so
#: scoring one such file takes 15 minutes or more.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "a0": {"accuracy_level": 0},
    "fp32": {"precision": "fp32"},
}


def prepare_ids(kind: str, args: argparse.Namespace, out: Path) -> tuple[Path, Path]:
    """The prompt's and the evaluation text's ids, from ortgen's tokenizer on ``kind``'s
    file, written beside ``out``: every engine and every file gets exactly these. The
    prompt is ``ortgen bench``'s default (the text's first ``--prompt-tokens``, 38), or
    with ``--chat-prompt`` compare.py's chat prompt (39 ids)."""
    messages = MESSAGES if args.chat_prompt else []
    result = run_json(
        [args.main_python, "-c", _PREPARE, str(gguf_path(kind, args)), json.dumps(messages),
         str(args.prompt_tokens), str(args.eval_tokens or 0)],
        args.timeout,
    )  # fmt: skip
    if isinstance(result, str):
        raise SystemExit(f"cannot tokenize the prompt with ortgen: {result}")
    prompt_file = out.with_name(out.stem + "-prompt.json")
    eval_file = out.with_name(out.stem + "-eval-ids.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    prompt_file.write_text(json.dumps(result["prompt"]))
    eval_file.write_text(json.dumps(result["eval"]))
    return prompt_file, eval_file


def quality(kind: str, eval_file: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Top-1 agreement of ortgen with llama.cpp on ``kind``'s file, and both perplexities;
    the same for each of ``--variants``, and with ``fp32`` among them, every engine's
    agreement with that float32 reference."""
    path, threads = gguf_path(kind, args), max(args.threads)
    theirs = run_json(
        [str(PEERS_PY), str(ENGINES_DIR / "run_llama_cpp.py"), "--model", str(path),
         "--prompt-ids", str(eval_file), "--threads", str(threads), "--eval-ids",
         str(eval_file), "--engine", f"llama.cpp {kind}"],
        args.timeout,
    )  # fmt: skip
    record: dict[str, Any] = {"variants": {}}
    if isinstance(theirs, str):
        record["llama_error"] = theirs
    else:
        record["llama_perplexity"] = theirs["perplexity"]
    top1: dict[str, list[int]] = {}
    for variant in ["default", *args.variants]:
        ours = run_json(
            [args.main_python, "-c", _ORTGEN_SCORES, str(path), str(eval_file), str(threads),
             json.dumps(VARIANTS[variant])],
            args.timeout,
        )  # fmt: skip
        if isinstance(ours, str):
            record["variants"][variant] = {"error": ours}
            continue
        top1[variant] = ours["top1"]
        record["variants"][variant] = {
            "perplexity": ours["perplexity"],
            "same_eval_ids": ours["same_eval_ids"],
        }
        if isinstance(theirs, dict):
            record["variants"][variant]["agreement_llama"] = agreement(ours["top1"], theirs["top1"])
    if "fp32" in top1:
        for variant, mine in top1.items():
            record["variants"][variant]["agreement_fp32"] = agreement(mine, top1["fp32"])
        if isinstance(theirs, dict):
            record["llama_agreement_fp32"] = agreement(theirs["top1"], top1["fp32"])
    default = record["variants"]["default"]
    record["ortgen_perplexity"] = default.get("perplexity")
    record["agreement_top1"] = default.get("agreement_llama")
    if "default" in top1 and isinstance(theirs, dict):
        pairs = enumerate(zip(top1["default"], theirs["top1"], strict=True))
        record["disagree_at"] = [i for i, (a, b) in pairs if a != b]
    return record


def agreement(mine: list[int], other: list[int]) -> float:
    """The share of positions whose top-1 tokens are equal."""
    if len(mine) != len(other):
        raise ValueError(f"{len(mine)} positions scored against {len(other)}")
    return sum(a == b for a, b in zip(mine, other, strict=True)) / len(mine)


# -- 3. speed --------------------------------------------------------------------------------


def engines_for(kinds: list[str], args: argparse.Namespace) -> list[Any]:
    """Two engines per file, ortgen then llama.cpp, both on the GGUF path itself."""
    engines = []
    for kind in kinds:
        path = gguf_path(kind, args)
        engines.append(
            compare.Engine(
                f"{ORTGEN}:{kind}", f"ortgen {kind}", Path(args.main_python), "run_ortgen.py",
                path, ["--mode", "cli"],
            )
        )  # fmt: skip
        engines.append(
            compare.Engine(
                f"{LLAMA}:{kind}", f"llama.cpp {kind}", PEERS_PY, "run_llama_cpp.py", path
            )
        )
    return engines


def round_order(engines: list[Any], round_index: int) -> list[Any]:
    """The files rotate by one each round, and the two engines of a file swap places every
    other round: no file and no engine always runs first, or right after the other."""
    pairs = [engines[i : i + 2] for i in range(0, len(engines), 2)]
    shift = round_index % len(pairs)
    pairs = pairs[shift:] + pairs[:shift]
    if round_index % 2:
        pairs = [pair[::-1] for pair in pairs]
    return [engine for pair in pairs for engine in pair]


def speed(engines: list[Any], prompt_file: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every engine at every thread count, ``args.rounds`` times, a fresh process each."""
    runs: list[dict[str, Any]] = []
    failures: Counter[tuple[str, int]] = Counter()
    for round_index in range(args.rounds):
        for threads in args.threads:
            for engine in round_order(engines, round_index):
                if failures[(engine.key, threads)] >= 2:
                    continue
                outcome = compare.run_once(engine, prompt_file, args, threads)
                record: dict[str, Any] = {
                    "round": round_index, "threads": threads, "engine": engine.key,
                    "loadavg_1min_after": os.getloadavg()[0],
                }  # fmt: skip
                if isinstance(outcome, str):
                    failures[(engine.key, threads)] += 1
                    record["error"] = outcome
                    log(f"round {round_index + 1} t={threads} {engine.key}: FAILED {outcome}")
                else:
                    record["result"] = outcome
                    log(
                        f"round {round_index + 1} t={threads} {engine.key:<18} decode "
                        f"{compare.fmt(outcome.get('decode_tokens_per_s'), '7.1f')} tok/s  "
                        f"RSS {compare.fmt(outcome.get('peak_rss_mb'), '5.0f')} MB"
                    )
                runs.append(record)
    return runs


def speed_summary(runs: list[dict[str, Any]], key: str, threads: int) -> dict[str, Any] | None:
    """Medians of one engine's timed runs at one thread count."""
    ok = [
        r["result"]
        for r in runs
        if r["engine"] == key and r["threads"] == threads and "result" in r
    ]
    if not ok:
        return None
    tokens = ok[0].get("greedy_tokens")
    return {
        "runs": len(ok),
        "decode_tokens_per_s": compare.median([r.get("decode_tokens_per_s") for r in ok]),
        "decode_tokens_per_s_all": [r.get("decode_tokens_per_s") for r in ok],
        "prefill_tokens_per_s": compare.median([r.get("prefill_tokens_per_s") for r in ok]),
        "peak_rss_mb": compare.median([r.get("peak_rss_mb") for r in ok]),
        "load_s": compare.median([r.get("load_s") for r in ok]),
        "greedy_tokens": tokens,
        "greedy_stable": all(r.get("greedy_tokens") == tokens for r in ok),
    }


# -- 4. bytes and nodes ------------------------------------------------------------------------

_LOOKUP_INPUTS = {"GatherBlockQuantized": (0, 2, 3), "Gather": (0,)}
_GQA_CACHES = (7, 8)  # GroupQueryAttention's cos_cache and sin_cache


def graph_reads(folder: Path) -> dict[str, Any]:
    """Bytes of initializers one decode step reads, by kind, from the graph as written.

    Streamed in full each step: MatMulNBits' B, scales, zero points and bias (``nbits_*``;
    the rows that only compute block sums for the minimum terms apart, ``blocksum_rows``),
    the minimum tables (``minimum``), float MatMul weights, norms and small constants
    (``other``). Read one row per token: each lookup table (the embedding's codes, scales,
    zero points and minimum, or a float table: ``embedding_row``) and the rotary caches
    (``rotary_row``). ``stored`` is every initializer's bytes (the graph's files).
    """
    import onnx

    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    sizes: dict[str, tuple[int, int]] = {}
    for tensor in graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        sizes[tensor.name] = (count * itemsize, int(tensor.dims[0]) if tensor.dims else 1)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    reads: Counter[str] = Counter()
    seen: set[str] = set()
    for node in graph.node:
        blocksum_share = 0.0
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            after = consumers.get(node.output[0], [])
            if any(n.op_type == "Split" and n.name.endswith("/RowsSplit") for n in after):
                blocksum_share = (attrs["K"] // attrs["block_size"]) / attrs["N"]
        for index, name in enumerate(node.input):
            if name not in sizes or name in seen:
                continue
            seen.add(name)
            size, rows = sizes[name]
            if index in _LOOKUP_INPUTS.get(node.op_type, ()):
                reads["embedding_row"] += size / rows
            elif node.op_type == "GroupQueryAttention" and index in _GQA_CACHES:
                reads["rotary_row"] += size / rows
            elif node.op_type == "MatMulNBits" and index in (1, 2, 3, 5):
                kind = {1: "nbits_codes", 2: "nbits_scales", 3: "nbits_zero_points", 5: "bias"}
                reads[kind[index]] += size * (1 - blocksum_share)
                reads["blocksum_rows"] += size * blocksum_share
            elif node.op_type == "MatMul" and name.endswith("minimum_T"):
                reads["minimum"] += size
            elif node.op_type == "MatMul":
                reads["float_matmul"] += size
            else:
                reads["other"] += size
    reads["total"] = sum(v for k, v in reads.items() if k != "total")
    ops = Counter(node.op_type for node in graph.node)
    return {
        "read_per_token": dict(reads),
        "stored": sum(size for size, _ in sizes.values()),
        "nodes": len(graph.node),
        "ops": dict(ops.most_common()),
    }


def runtime_nodes(folder: Path) -> dict[str, Any]:
    """Nodes per decode step as onnxruntime runs them: the graph after its optimisations
    (ortgen's session options: the default level, ORT_ENABLE_ALL), saved and counted."""
    import onnx
    import onnxruntime as ort

    from ortgen.model.session import session_options

    with tempfile.TemporaryDirectory() as tmp:
        options = session_options(1)
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.onnx.data"
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
        ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    return {"nodes": len(graph.node), "ops": dict(ops.most_common())}


def llama_reads(path: Path) -> dict[str, float]:
    """Bytes llama.cpp reads per decode step from the file: every tensor in full, except
    the embedding (one row) unless it is tied (then also read in full as the LM head)."""
    import gguf

    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    reads: Counter[str] = Counter()
    for tensor in reader.tensors:
        size = int(tensor.n_bytes)
        reads["file_tensors"] += size
        if tensor.name == "token_embd.weight":
            row = size / int(tensor.shape[-1])
            reads["embedding_row"] += row
            reads["per_token"] += row + (size if tied else 0)
        else:
            reads["per_token"] += size
    return dict(reads)


def layout_bytes(path: Path) -> dict[str, dict[str, float]]:
    """Per GGUF type of the file's matrices: weights, bytes in the file, and bytes of
    ortgen's exact MatMulNBits layout of them (codes, scales, zero points, minimum: what
    ``ortgen.gguf.quant_layout.to_layout`` gives the builder), with bits per weight."""
    import gguf

    from ortgen.gguf.quant_layout import FloatWeight, to_layout

    reader = gguf.GGUFReader(path)
    table: dict[str, Counter[str]] = {}
    for tensor in reader.tensors:
        if len(tensor.shape) != 2:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        layout = to_layout(tensor.tensor_type, tensor.data, shape, verify=False, name=tensor.name)
        row = table.setdefault(tensor.tensor_type.name, Counter())
        row["tensors"] += 1
        row["weights"] += shape[0] * shape[1]
        row["gguf_bytes"] += int(tensor.n_bytes)
        if isinstance(layout, FloatWeight):
            row["ortgen_bytes"] += layout.values.nbytes
            continue
        row["bits"] = layout.bits
        row["block"] = layout.block_size
        row["codes"] += layout.codes.nbytes
        row["scales"] += layout.scales.nbytes
        zero_points = 0 if layout.zero_point is None else layout.zero_point.nbytes
        minimum = 0 if layout.minimum is None else layout.minimum.nbytes
        row["zero_points"] += zero_points
        row["minimum"] += minimum
        row["ortgen_bytes"] += layout.codes.nbytes + layout.scales.nbytes + zero_points + minimum
    out: dict[str, dict[str, float]] = {}
    for kind, row in table.items():
        entry = {k: float(v) for k, v in row.items()}
        entry["gguf_bits_per_weight"] = 8 * row["gguf_bytes"] / row["weights"]
        entry["ortgen_bits_per_weight"] = 8 * row["ortgen_bytes"] / row["weights"]
        out[kind] = entry
    return out


def analyse(path: Path, folder: Path, args: argparse.Namespace) -> dict | str:
    """``type_mix``, ``graph_reads``, ``runtime_nodes``, ``llama_reads`` and ``layout_bytes``
    of one file and its build, in a fresh process (``--analyse``): this process stays small,
    since a child's peak RSS (``ru_maxrss``) starts from its parent's resident size at
    fork, and a timed run's peak RSS must be its engine's alone."""
    script = Path(__file__).resolve()
    return run_json(
        [args.main_python, str(script), "--analyse", str(path), str(folder)], args.timeout
    )


def analysis_of(path: Path, folder: Path) -> dict[str, Any]:
    """What ``analyse`` prints (run in its own process)."""
    return {
        "mix": type_mix(path),
        "graph": graph_reads(folder),
        "runtime_nodes": runtime_nodes(folder),
        "llama_reads": llama_reads(path),
        "layout": layout_bytes(path),
    }


_LLAMA_NODES = """
import json, os, re, sys, tempfile
from llama_cpp import Llama
with tempfile.TemporaryFile(mode="w+") as err:
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)
    try:
        Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, verbose=True)
    finally:
        os.dup2(saved, 2)
    err.seek(0)
    text = err.read()
found = re.findall(r"graph[: ]+nodes\\s*=\\s*(\\d+)", text)
print(json.dumps({"graph_nodes": [int(n) for n in found]}))
"""


def llama_nodes(path: Path, timeout: float) -> dict | str:
    """llama.cpp's own count of its compute graph's nodes (``graph: nodes = N`` in its log
    of the reserve graph, the same network as a decode step's; ggml counts its views,
    reshapes and permutes, which move no data, as nodes too)."""
    if not PEERS_PY.exists():
        return "no peers venv"
    return run_json([str(PEERS_PY), "-c", _LLAMA_NODES, str(path)], timeout)


# -- report ----------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    return compare.fmt(value, spec, suffix)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarise(kinds: list[str], report: dict[str, Any], runs: list[dict]) -> list[dict]:
    """One row per file: build, quality, speed (medians and ratios), bytes, nodes."""
    rows = []
    for kind in kinds:
        row: dict[str, Any] = {"type": kind, **report["files"].get(kind, {})}
        for threads in report["meta"]["threads"]:
            mine = speed_summary(runs, f"{ORTGEN}:{kind}", threads)
            theirs = speed_summary(runs, f"{LLAMA}:{kind}", threads)
            goal = 1.2 if kind in FOUR_BIT else 1.0
            decode = ratio(
                mine and mine["decode_tokens_per_s"], theirs and theirs["decode_tokens_per_s"]
            )
            row[f"t{threads}"] = {
                "ortgen": mine,
                "llama": theirs,
                "decode_ratio": decode,
                "goal": goal,
                "goal_met": None if decode is None else decode >= goal,
                "rss_ratio": ratio(mine and mine["peak_rss_mb"], theirs and theirs["peak_rss_mb"]),
            }
        rows.append(row)
    return rows


def markdown(rows: list[dict], meta: dict[str, Any]) -> str:
    """The report as markdown: build and quality, speed, bytes and nodes."""
    lines = [
        f"SmolLM2-135M-Instruct GGUF files (llama.cpp's quantiser from the published Q4_1), "
        f"{meta['prompt_tokens']}-token {meta['prompt']} prompt, {meta['new_tokens']} greedy "
        f"tokens, EOS ignored; medians of {meta['rounds']} rounds round-robin, a fresh process "
        f"per run ({meta['machine']}, {meta['cores']} cores; median 1-min load average after a "
        f"run: {fmt(meta['loadavg_1min_median'])}).",
        "",
        "**Build and quality** (ortgen default options: exact weights, accuracy level 4; "
        f"top-1 agreement with llama.cpp on the same file over {meta['eval_tokens']} tokens of "
        "the evaluation text, teacher-forced; goal >= 0.97)",
        "",
        "| file | tensor types (llama.cpp's choice) | build s | build peak RSS MB "
        "| top-1 vs llama.cpp | ppl ortgen | ppl llama.cpp |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        built = row.get("build") or {}
        q = row.get("quality") or {}
        agree = q.get("agreement_top1")
        mark = "" if agree is None else (" ✓" if agree >= 0.97 else " ✗")
        lines.append(
            f"| {row['type']} | {mix_label(row['mix']) if 'mix' in row else '—'} "
            f"| {fmt(built.get('build_s'), '.1f')} | {fmt(built.get('peak_rss_mb'), '.0f')} "
            f"| {fmt(agree, '.4f')}{mark} | {fmt(q.get('ortgen_perplexity'), '.3f')} "
            f"| {fmt(q.get('llama_perplexity'), '.3f')} |"
        )
    lines.append("")
    lines += variants_table(rows)
    for threads in meta["threads"]:
        lines += [
            f"**Decode, {threads} thread{'s' if threads > 1 else ''}** (goal: ortgen / llama.cpp "
            ">= 1.0x, >= 1.2x on the 4-bit files; peak RSS of each decoding process)",
            "",
            "| file | ortgen tok/s | llama.cpp tok/s | ortgen / llama.cpp | goal "
            "| ortgen RSS MB | llama.cpp RSS MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            cell = row.get(f"t{threads}") or {}
            mine, theirs = cell.get("ortgen") or {}, cell.get("llama") or {}
            met = cell.get("goal_met")
            goal = "—" if met is None else f"{cell['goal']:.1f}x {'met' if met else 'not met'}"
            lines.append(
                f"| {row['type']} | {fmt(mine.get('decode_tokens_per_s'))} "
                f"| {fmt(theirs.get('decode_tokens_per_s'))} "
                f"| {fmt(cell.get('decode_ratio'), '.2f', 'x')} | {goal} "
                f"| {fmt(mine.get('peak_rss_mb'), '.0f')} "
                f"| {fmt(theirs.get('peak_rss_mb'), '.0f')} |"
            )
        lines.append("")
    lines += [
        "**Bytes and nodes per decode step** (MB = 10^6 bytes. ortgen: MatMulNBits B + scales "
        "+ zero points + bias, minimum tables, block-sum rows, one row of each lookup table, "
        "norms and constants, from the graph as written; llama.cpp: every tensor of the file, "
        "the tied embedding in full as the LM head. Nodes: ortgen's graph as written / as "
        "onnxruntime runs it after its optimisations; llama.cpp's graph nodes from its log)",
        "",
        "| file | GGUF tensors MB | llama.cpp reads MB | ortgen reads MB | ortgen / llama.cpp "
        "| of which minimum + block sums MB | ortgen nodes (written / run) "
        "| MatMulNBits | llama.cpp nodes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        graph = row.get("graph") or {}
        reads = graph.get("read_per_token") or {}
        theirs = row.get("llama_reads") or {}
        run = row.get("runtime_nodes") or {}
        nodes = row.get("llama_nodes") or {}
        extra = (reads.get("minimum") or 0) + (reads.get("blocksum_rows") or 0)
        llama_count = (nodes.get("graph_nodes") or [None])[0] if isinstance(nodes, dict) else None
        lines.append(
            f"| {row['type']} | {fmt(theirs.get('file_tensors', 0) / 1e6)} "
            f"| {fmt(theirs.get('per_token', 0) / 1e6)} | {fmt(reads.get('total', 0) / 1e6)} "
            f"| {fmt(ratio(reads.get('total'), theirs.get('per_token')), '.2f', 'x')} "
            f"| {fmt(extra / 1e6)} | {graph.get('nodes', '—')} / {run.get('nodes', '—')} "
            f"| {(graph.get('ops') or {}).get('MatMulNBits', '—')} "
            f"| {fmt(llama_count, 'd') if llama_count is not None else '—'} |"
        )
    lines += [
        "",
        "**Bits per weight by GGUF type** (the file's matrices: GGUF's bytes against ortgen's "
        "exact layout: codes + fp32 scales + zero points + fp32 minimum; the tied embedding "
        "once, as the LM head)",
        "",
        "| file | GGUF type | tensors | weights M | GGUF bpw | ortgen bits/block | ortgen bpw "
        "| ortgen / GGUF |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for kind, entry in (row.get("layout") or {}).items():
            shape = f"{int(entry['bits'])} / {int(entry['block'])}" if "bits" in entry else "float"
            lines.append(
                f"| {row['type']} | {kind} | {int(entry['tensors'])} "
                f"| {entry['weights'] / 1e6:.2f} | {entry['gguf_bits_per_weight']:.2f} | {shape} "
                f"| {entry['ortgen_bits_per_weight']:.2f} "
                f"| {entry['ortgen_bytes'] / entry['gguf_bytes']:.2f}x |"
            )
    lines.append("")
    return "\n".join(lines)


def variants_table(rows: list[dict]) -> list[str]:
    """With ``--variants``: each ortgen build's perplexity and top-1 agreement with
    llama.cpp and with the fp32 reference, and llama.cpp's own (no lines without)."""
    if not any(len((row.get("quality") or {}).get("variants", {})) > 1 for row in rows):
        return []
    lines = [
        "**Quality by ortgen build** (default: accuracy level 4; a0: accuracy level 0, float "
        "activations; fp32: every weight dequantised, the file's network in float32)",
        "",
        "| file | engine | perplexity | top-1 vs llama.cpp | top-1 vs fp32 |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        q = row.get("quality") or {}
        for name, v in q.get("variants", {}).items():
            lines.append(
                f"| {row['type']} | ortgen {name} | {fmt(v.get('perplexity'), '.3f')} "
                f"| {fmt(v.get('agreement_llama'), '.4f')} "
                f"| {fmt(v.get('agreement_fp32'), '.4f')} |"
            )
        lines.append(
            f"| {row['type']} | llama.cpp | {fmt(q.get('llama_perplexity'), '.3f')} | — "
            f"| {fmt(q.get('llama_agreement_fp32'), '.4f')} |"
        )
    return [*lines, ""]


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:2] == ["--analyse"]:  # one file's bytes and nodes (see ``analyse``)
        print(json.dumps(analysis_of(Path(sys.argv[2]), Path(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--types", nargs="+", default=gguf_files.ALL_TYPES, choices=gguf_files.ALL_TYPES
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--prompt-tokens", type=int, default=38, help="prompt: the evaluation text's first N"
    )
    parser.add_argument(
        "--chat-prompt", action="store_true", help="prompt: compare.py's chat prompt instead"
    )
    parser.add_argument(
        "--eval-tokens", type=int, help="score only this many tokens of the evaluation text"
    )
    parser.add_argument(
        "--reuse-builds", action="store_true", help="keep cached builds (no build time then)"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        choices=[v for v in VARIANTS if v != "default"],
        help="ortgen builds scored besides the default: a0 (accuracy level 0), fp32 "
        "(dequantised weights: the reference every engine's agreement is also given with)",
    )
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--no-llama", action="store_true", help="ortgen only")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument(
        "--gguf-dir", default=str(GGUF_DIR), help="folder of SmolLM2-135M-Instruct.TYPE.gguf"
    )
    parser.add_argument("--main-python", default=str(MAIN_PY))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", help="JSON path (default: benchmarks/results/gguf-TS.json)")
    args = parser.parse_args()

    out = Path(args.out) if args.out else RESULTS / f"gguf-{time.strftime('%Y%m%d-%H%M%S')}.json"
    os.environ["ORTGEN_MODELS_DIR"] = str(cache_dir(args))  # every process started here
    kinds = [k for k in args.types if gguf_path(k, args).is_file()]
    for kind in sorted(set(args.types) - set(kinds)):
        missing = gguf_path(kind, args)
        log(f"skipping {kind}: no {missing} (run `bash benchmarks/setup_peers.sh`)")
    if not kinds:
        raise SystemExit("no GGUF files to measure")
    peers = not args.no_llama and compare.imports(PEERS_PY, "llama_cpp")
    if not peers and not args.no_llama:
        log("llama-cpp-python is not built in benchmarks/.venv-peers: ortgen only")

    files: dict[str, dict[str, Any]] = {kind: {} for kind in kinds}
    for kind in kinds:
        entry = files[kind]
        outcome = build(kind, args)
        if isinstance(outcome, str):
            entry["build_error"] = outcome
            log(f"build {kind}: FAILED {outcome}")
            continue
        entry["build"] = outcome
        analysis = analyse(gguf_path(kind, args), Path(outcome["folder"]), args)
        if isinstance(analysis, str):
            entry["analysis_error"] = analysis
            log(f"analysis {kind}: FAILED {analysis}")
        else:
            entry.update(analysis)
        log(
            f"build {kind}: {outcome['build_s']:.1f} s (+{outcome['import_s']:.1f} s imports), "
            f"peak RSS {outcome['peak_rss_mb']:.0f} MB; "
            f"{mix_label(entry['mix']) if 'mix' in entry else '?'}"
        )
        if peers:
            entry["llama_nodes"] = llama_nodes(gguf_path(kind, args), args.timeout)
    built = [k for k in kinds if "build" in files[k]]
    if not built:
        raise SystemExit("no file built")

    prompt_file, eval_file = prepare_ids(built[0], args, out)
    prompt = json.loads(prompt_file.read_text())
    eval_count = len(json.loads(eval_file.read_text()))
    log(f"prompt: {len(prompt)} tokens; evaluation text: {eval_count} tokens")
    if not args.no_quality and peers:
        for kind in built:
            files[kind]["quality"] = quality(kind, eval_file, args)
            q = files[kind]["quality"]
            log(
                f"quality {kind}: top-1 agreement {fmt(q.get('agreement_top1'), '.4f')}, "
                f"perplexity ortgen {fmt(q.get('ortgen_perplexity'), '.3f')} / llama.cpp "
                f"{fmt(q.get('llama_perplexity'), '.3f')}"
                + "".join(
                    f" [{name}: {v.get('error') or fmt(v.get('agreement_llama'), '.4f')}]"
                    for name, v in q["variants"].items()
                    if name != "default"
                )
                + (f" [llama.cpp: {q['llama_error']}]" if "llama_error" in q else "")
            )

    runs: list[dict[str, Any]] = []
    if not args.no_speed:
        engines = engines_for(built, args)
        if not peers:
            engines = [e for e in engines if e.key.startswith(ORTGEN)]
        busy = os.getloadavg()[0]
        if busy > 0.5:
            log(f"load average {busy:.1f} before the first run: other work shares the cores")
        runs = speed(engines, prompt_file, args)

    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": compare.cpu_name(),
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt),
        "prompt": "chat" if args.chat_prompt else "evaluation-text",
        "prompt_ids": prompt,
        "eval_tokens": eval_count,
        "loadavg_1min_median": compare.median([r.get("loadavg_1min_after") for r in runs]),
        # every child's ru_maxrss starts from this process's resident size at fork
        "harness_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "versions": {
            "main": compare.versions(Path(args.main_python)),
            "peers": compare.versions(PEERS_PY),
        },
    }
    report = {"meta": meta, "files": files}
    rows = summarise(built, report, runs)
    compare.write_results(out, meta, rows, runs, markdown(rows, meta))
    log(f"written {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
