"""Side by side: ortgen against llama.cpp, onnxruntime-genai, optimum and transformers.

Why this shape (issue 5, item 6): the machine is noisy, so a fair comparison alternates the
engines round-robin (the order rotates each round), runs each one in a fresh process (no
warm caches or allocator state shared between engines; the peak RSS is that engine's
alone), repeats several rounds and reports medians and ratios measured in the same run.
Every engine gets the same prompt token ids (no tokenizer differences), generates the same
number of greedy tokens with EOS ignored, and reports prefill and decode separately. The
greedy tokens are compared with transformers PyTorch fp32 (the reference) as the length of
the common prefix: fp32 engines should match all of them; quantised ones diverge after a
few tokens, which is chaotic rather than a quality measure. A run that returns another
number of tokens than asked for, or says it stopped early, is a failed run, not a sample.

Output quality, once per engine apart from the timed runs (the quality pass): the
perplexity of ``ortgen bench``'s evaluation text, teacher-forced, and top-1 agreement with
the fp32 reference (``--reference``) at each position: ``ortgen bench --quality`` for the
ortgen columns, each peer runner's ``--eval-ids`` mode for llama.cpp and onnxruntime-genai
(the same ids, from ortgen's tokenizer; the reference's top-1 from ortgen's scoring).

Engines (runner scripts in benchmarks/engines/, one engine's imports each):

- ``llama.cpp``: llama-cpp-python on the Q4_1 GGUF itself (peers venv)
- ``genai-int4`` / ``genai-fp32``: onnxruntime-genai 0.18's own loop on its builder's graphs
  (peers venv)
- ``ortgen``: the default model folder, or each ``--ortgen-models name=DIR`` (main venv)
- ``optimum-fp32``: optimum ``ORTModelForCausalLM`` on an optimum-graph fp32 export (main)
- ``torch-fp32``: transformers PyTorch fp32 on the GGUF's transformers folder (main venv)

The peers venv and its models come from ``bash benchmarks/setup_peers.sh``; an engine whose
environment or model is missing is skipped with a line saying why. Usage::

    .venv/bin/python benchmarks/compare.py [--rounds 3] [--threads 1 2] [--engines ...]
        [--ortgen-models fused=exported_models/X int4=exported_models/Y]

Writes benchmarks/results/compare-<timestamp>.json and .md, and docs/img/compare.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENGINES_DIR = HERE / "engines"
MODELS = HERE / ".models"
RESULTS = HERE / "results"
MAIN_PY = ROOT / ".venv" / "bin" / "python"
PEERS_PY = HERE / ".venv-peers" / "bin" / "python"
GGUF = ROOT / "exported_models" / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = ROOT / "exported_models" / "smollm2-135m-instruct"
CHART = ROOT / "docs" / "img" / "compare.png"
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]

#: the engines every ratio is taken against, and the greedy reference
LLAMA, GENAI_INT4, REFERENCE = "llama.cpp", "genai-int4", "torch-fp32"
PEER_KEYS = ["llama.cpp", "genai-int4", "genai-fp32", "optimum-fp32", "torch-fp32"]
VERSION_PACKAGES = [
    "llama-cpp-python", "onnxruntime-genai", "onnxruntime", "optimum", "optimum-onnx",
    "transformers", "torch", "numpy",
]  # fmt: skip


@dataclass
class Engine:
    """One column of the comparison: which interpreter runs which runner on which model."""

    key: str
    label: str
    python: Path
    script: str
    model: Path
    extra: list[str] = field(default_factory=list)
    missing: str | None = None  # why it cannot run here (then it is skipped)

    def command(self, prompt_file: Path, new_tokens: int, threads: int) -> list[str]:
        return [
            str(self.python), str(ENGINES_DIR / self.script), "--model", str(self.model),
            "--prompt-ids", str(prompt_file), "--new-tokens", str(new_tokens),
            "--threads", str(threads), "--engine", self.label, *self.extra,
        ]  # fmt: skip


def log(message: str) -> None:
    print(f"[compare] {message}", flush=True)


def imports(python: Path, module: str) -> bool:
    """Whether ``module`` imports in that interpreter (a missing venv answers False)."""
    if not python.exists():
        return False
    done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, check=False)
    return done.returncode == 0


# -- models made on first use (main venv) ---------------------------------------------------


def ensure_hf_folder(main_py: Path) -> str | None:
    """GGUF -> transformers folder for the PyTorch reference; returns why not, or None."""
    hf = MODELS / "hf"
    if (hf / "config.json").exists():
        return None
    if not GGUF.exists():
        return f"no {GGUF.relative_to(ROOT)} (run `make model`)"
    log(f"building the transformers folder {hf} from the GGUF")
    code = (
        "import sys\nfrom pathlib import Path\n"
        "try:\n    from ortgen.export.gguf import gguf_to_hf_folder\n"
        "except ImportError:\n    from ortgen.gguf import gguf_to_hf_folder\n"
        "gguf_to_hf_folder(Path(sys.argv[1]), Path(sys.argv[2]))\n"
    )
    done = subprocess.run([str(main_py), "-c", code, str(GGUF), str(hf)], check=False)
    return None if done.returncode == 0 else "gguf_to_hf_folder failed"


def is_optimum_fp32_folder(folder: Path) -> bool:
    """An ortgen export with the optimum graph at fp32 (what ortgen used to export)."""
    manifest = folder / "ortgen_manifest.json"
    if not manifest.exists() or (folder / "genai_config.json").exists():
        return False
    facts = json.loads(manifest.read_text())
    variant = facts.get("variant") or {}  # manifest format 2; format 1 was always this graph
    return variant.get("graph", "optimum") == "optimum" and variant.get("precision", "fp32") in (
        "fp32",
        "float32",
    )


def ensure_optimum_folder(main_py: Path) -> str | None:
    """An optimum fp32 folder for ``ORTModelForCausalLM``; returns why not, or None.

    ``ortgen export GGUF OUT --precision fp32 --graph optimum`` when the CLI has those flags
    (issue 5), plain ``ortgen export GGUF OUT`` before (it made exactly that graph), and as
    a last resort a copy of the default model folder when its manifest says it is that graph.
    """
    out = MODELS / "optimum-fp32"
    if (out / "model.onnx").exists():
        return None
    cli = main_py.parent / "ortgen"
    if GGUF.exists() and cli.exists():
        helptext = subprocess.run(
            [str(cli), "export", "--help"], capture_output=True, text=True, check=False
        ).stdout
        command = [str(cli), "export", str(GGUF), str(out)]
        if "--graph" in helptext:
            command += ["--precision", "fp32", "--graph", "optimum"]
        log(f"exporting the optimum fp32 folder: {' '.join(command)}")
        if subprocess.run(command, check=False).returncode == 0:
            return None
        shutil.rmtree(out, ignore_errors=True)
    if is_optimum_fp32_folder(DEFAULT_MODEL):
        log(f"copying {DEFAULT_MODEL.relative_to(ROOT)} (an optimum fp32 graph) to {out}")
        shutil.copytree(DEFAULT_MODEL, out)
        return None
    return "no optimum fp32 folder and `ortgen export` could not make one"


# -- the prompt ------------------------------------------------------------------------------


def render_prompt(main_py: Path, out: Path) -> list[int]:
    """The chat prompt's ids from ortgen's tokenizer and chat template (transformers' as a
    fallback while ortgen is being edited): every engine is fed exactly these ids."""
    code = (
        "import json, sys\n"
        "messages = json.loads(sys.argv[2])\n"
        "try:\n"
        "    import ortgen\n"
        "    ids = ortgen.load(sys.argv[1], threads=1).chat_prompt(messages)\n"
        "except Exception:\n"
        "    from transformers import AutoTokenizer\n"
        "    tok = AutoTokenizer.from_pretrained(sys.argv[3])\n"
        "    ids = tok.apply_chat_template(messages, add_generation_prompt=True)\n"
        "print(json.dumps([int(i) for i in ids]))\n"
    )
    done = subprocess.run(
        [str(main_py), "-c", code, str(DEFAULT_MODEL), json.dumps(MESSAGES), str(MODELS / "hf")],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ids))
    return ids


# -- engines ---------------------------------------------------------------------------------


def build_engines(args: argparse.Namespace) -> list[Engine]:
    """Every engine asked for, each marked with why it is missing when it cannot run."""
    main_py = Path(args.main_python)
    peers_ok = PEERS_PY.exists()
    no_peers = "no benchmarks/.venv-peers (run `bash benchmarks/setup_peers.sh`)"
    engines: list[Engine] = []

    llama = Engine("llama.cpp", "llama.cpp Q4_1", PEERS_PY, "run_llama_cpp.py", GGUF)
    if not peers_ok:
        llama.missing = no_peers
    elif not GGUF.exists():
        llama.missing = f"no {GGUF} (run `make model`)"
    elif not imports(PEERS_PY, "llama_cpp"):
        llama.missing = "llama-cpp-python is not built (run `bash benchmarks/setup_peers.sh`)"
    engines.append(llama)

    genai_ok = peers_ok and imports(PEERS_PY, "onnxruntime_genai")
    for prec in ("int4", "fp32"):
        folder = MODELS / f"genai-{prec}"
        genai = Engine(
            f"genai-{prec}", f"onnxruntime-genai {prec}", PEERS_PY, "run_genai.py", folder
        )
        if not genai_ok:
            genai.missing = no_peers if not peers_ok else "onnxruntime-genai does not import"
        elif not (folder / "genai_config.json").exists():
            genai.missing = f"no {folder} (run `bash benchmarks/setup_peers.sh`)"
        engines.append(genai)

    mode = args.ortgen_mode
    if mode == "auto":
        mode = "cli" if ortgen_has_bench(main_py) else "loop"
    for name, folder in args.ortgen_models:
        label = "ortgen" if name == "ortgen" else f"ortgen {name}"
        key = "ortgen" if name == "ortgen" else f"ortgen:{name}"
        engine = Engine(key, label, main_py, "run_ortgen.py", folder, ["--mode", mode])
        if not main_py.exists():
            engine.missing = f"no main venv {main_py} (run `make`)"
        elif not folder.is_dir():
            engine.missing = f"no model folder {folder}"
        engines.append(engine)

    optimum = Engine(
        "optimum-fp32", "optimum ORT fp32", main_py, "run_optimum.py", MODELS / "optimum-fp32"
    )
    torch_ref = Engine(
        "torch-fp32", "transformers PyTorch fp32", main_py, "run_transformers.py", MODELS / "hf"
    )
    engines += [optimum, torch_ref]

    selected = [e for e in engines if not args.engines or selects(args.engines, e.key)]
    for engine in selected:  # the main-venv models are made on first use, only when asked for
        if engine.missing or not main_py.exists():
            engine.missing = engine.missing or f"no main venv {main_py}"
            continue
        if engine.key == "torch-fp32":
            engine.missing = ensure_hf_folder(main_py)
        elif engine.key == "optimum-fp32":
            engine.missing = ensure_optimum_folder(main_py)
    return selected


def selects(patterns: list[str], key: str) -> bool:
    """``--engines`` matches a key exactly, or a prefix (``genai`` picks both, ``ortgen`` all
    ortgen columns)."""
    return any(key == p or key.startswith(p) for p in patterns)


def ortgen_has_bench(main_py: Path) -> bool:
    """Whether the main venv's ortgen has ``bench --prompt-ids`` (being written)."""
    cli = main_py.parent / "ortgen"
    if not cli.exists():
        return False
    done = subprocess.run(
        [str(cli), "bench", "--help"], capture_output=True, text=True, check=False
    )
    return done.returncode == 0 and "--prompt-ids" in done.stdout


def write_results(out: Path, meta: dict, rows: list[dict], runs: list, table: str) -> None:
    """The side-by-side run as JSON (``meta``, ``summary``, ``runs``) and its table as
    Markdown beside it, and the table on stdout (the caller logs where they went)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1))
    out.with_suffix(".md").write_text(table)
    print()
    print(table)


def versions(python: Path) -> dict[str, str]:
    """Installed versions of the packages that matter, as that interpreter sees them."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n        out[name] = metadata.version(name)\n"
        "    except metadata.PackageNotFoundError:\n        pass\n"
        "print(json.dumps(out))\n"
    )
    if not python.exists():
        return {}
    done = subprocess.run(
        [str(python), "-c", code, *VERSION_PACKAGES], capture_output=True, text=True, check=False
    )
    return json.loads(done.stdout) if done.returncode == 0 else {}


# -- running ---------------------------------------------------------------------------------


def parse_result(stdout: str) -> dict | None:
    """The runner's JSON: the whole output, or the last line (or block) that parses."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    return None


def run_problem(result: dict, new_tokens: int) -> str | None:
    """Why a timed run's result cannot stand beside the others, or None: every engine must
    produce exactly ``new_tokens`` greedy tokens (EOS ignored), so a peer that stopped early
    (onnxruntime-genai on its stand-in EOS) or returned another count timed other work."""
    tokens = result.get("greedy_tokens")
    if result.get("stopped_early"):
        count = len(tokens) if isinstance(tokens, list) else "?"
        return f"stopped early ({count} of {new_tokens} tokens)"
    if not isinstance(tokens, list) or len(tokens) != new_tokens:
        count = len(tokens) if isinstance(tokens, list) else "no"
        return f"{count} greedy tokens, not the {new_tokens} asked for"
    return None


def run_once(
    engine: Engine,
    prompt_file: Path,
    args: argparse.Namespace,
    threads: int,
    extra: list[str] | None = None,
):
    """One fresh process of one engine; the result dict, or an error string. A timed run
    (no ``extra``) must have produced exactly ``args.new_tokens`` tokens."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = [*engine.command(prompt_file, args.new_tokens, threads), *(extra or [])]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {args.timeout} s"
    wall = time.perf_counter() - start
    result = parse_result(done.stdout) if done.returncode == 0 else None
    if result is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"exit {done.returncode}: " + " | ".join(tail)
    problem = None if extra else run_problem(result, args.new_tokens)
    if problem:
        return problem
    result["process_s"] = wall
    return result


def quality_pass(
    engines: list[Engine], prompt_file: Path, args: argparse.Namespace, runs: list[dict]
) -> None:
    """Output quality, once per engine, apart from the timed runs (not in their medians):
    ``ortgen bench --quality`` for an ortgen column; a peer runner's ``--eval-ids`` mode for
    llama.cpp and onnxruntime-genai, whose top-1 this compares with the reference's."""
    reference = Path(args.reference)
    threads = max(args.threads)
    peers = [e for e in engines if e.script in ("run_genai.py", "run_llama_cpp.py")]
    scored = None
    if peers:
        scored = reference_scores(Path(args.main_python), reference, prompt_file, args.eval_tokens)
    if isinstance(scored, str):
        log(f"quality of the peers: {scored}")
    for engine in engines:
        record = {"round": None, "threads": threads, "engine": engine.key, "quality": True}
        if engine.script == "run_ortgen.py" and "cli" in engine.extra:
            extra = ["--quality"]
            if (reference / "model.onnx").exists():
                extra += ["--reference", str(reference)]
            if args.eval_tokens:
                extra += ["--eval-tokens", str(args.eval_tokens)]
            outcome = run_once(engine, prompt_file, args, threads, extra)
        elif engine in peers and isinstance(scored, dict):
            outcome = run_once(engine, prompt_file, args, threads, ["--eval-ids", scored["file"]])
            if isinstance(outcome, dict):
                outcome = peer_quality(outcome, scored)
        else:
            continue
        if isinstance(outcome, str):
            record["error"] = outcome
            log(f"quality {engine.key}: FAILED {outcome}")
        else:
            record["result"] = outcome
            log(
                f"quality {engine.key}: perplexity {fmt(outcome.get('perplexity'), '.3f')}, "
                f"top-1 agreement {fmt(outcome.get('agreement_top1'), '.4f')}"
            )
        runs.append(record)


def reference_scores(
    main_py: Path, reference: Path, prompt_file: Path, eval_tokens: int | None = None
) -> dict | str:
    """The evaluation text's ids (written next to the prompt, for the peer runners) and the
    reference folder's perplexity and top-1 per position, scored by ortgen in the main venv
    as ``ortgen bench`` scores it; or why not."""
    if not (reference / "model.onnx").exists():
        return f"no reference folder {reference}"
    ids_file = prompt_file.with_name(prompt_file.stem + "-eval-ids.json")
    code = (
        "import json, sys\nimport ortgen\n"
        "from ortgen.bench.quality import eval_ids, score_tokens\n"
        "gen = ortgen.load(sys.argv[1], threads=2)\n"
        "ids = eval_ids(gen)[: int(sys.argv[3]) or None]\n"
        "scores = score_tokens(gen, ids)\n"
        "open(sys.argv[2], 'w').write(json.dumps(ids))\n"
        "print(json.dumps({'perplexity': scores.perplexity, 'top1': scores.top1.tolist()}))\n"
    )
    done = subprocess.run(
        [str(main_py), "-c", code, str(reference), str(ids_file), str(eval_tokens or 0)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    result = parse_result(done.stdout) if done.returncode == 0 else None
    if result is None:
        return "scoring the reference failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return {**result, "file": str(ids_file)}


def peer_quality(outcome: dict, reference: dict) -> dict:
    """A peer's quality line with its top-1 agreement with the reference (the same keys
    ``ortgen bench`` reports)."""
    mine, theirs = outcome.get("top1") or [], reference["top1"]
    if len(mine) != len(theirs):
        raise ValueError(f"{len(mine)} positions scored, the reference has {len(theirs)}")
    same = sum(a == b for a, b in zip(mine, theirs, strict=True))
    return {
        "perplexity": outcome.get("perplexity"),
        "reference_perplexity": reference["perplexity"],
        "agreement_top1": same / len(theirs),
        "eval_tokens": outcome.get("eval_tokens"),
    }


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def common_prefix(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def summarise(engines: list[Engine], runs: list[dict], threads_list: list[int]) -> list[dict]:
    """Medians per engine and thread count, ratios to llama.cpp and genai int4, agreement."""
    rows = []
    for threads in threads_list:
        by_key: dict[str, dict] = {}
        for engine in engines:
            ok = [
                r["result"]
                for r in runs
                if r["engine"] == engine.key
                and r["threads"] == threads
                and "result" in r
                and not r.get("quality")
            ]
            if not ok:
                continue
            tokens = ok[0].get("greedy_tokens", [])
            row = {
                "engine": engine.key,
                "label": engine.label,
                "threads": threads,
                "runs": len(ok),
                "decode_tokens_per_s": median([r.get("decode_tokens_per_s") for r in ok]),
                "decode_tokens_per_s_all": [r.get("decode_tokens_per_s") for r in ok],
                "prefill_tokens_per_s": median([r.get("prefill_tokens_per_s") for r in ok]),
                "peak_rss_mb": median([r.get("peak_rss_mb") for r in ok]),
                "peak_rss_mb_max": max(r.get("peak_rss_mb") or 0 for r in ok),
                "load_s": median([r.get("load_s") for r in ok]),
                "first_token_s": median([r.get("first_token_s") for r in ok]),
                "greedy_tokens": tokens,
                "greedy_stable": all(r.get("greedy_tokens") == tokens for r in ok),
            }
            for extra in ("decode_ms_per_token_p50", "python_ms_per_token", "session_run_share"):
                if any(r.get(extra) is not None for r in ok):
                    row[extra] = median([r.get(extra) for r in ok])
            quality = [
                r["result"]
                for r in runs
                if r["engine"] == engine.key and r.get("quality") and "result" in r
            ]
            for extra in ("agreement_top1", "perplexity", "reference_perplexity"):
                if quality and quality[-1].get(extra) is not None:
                    row[extra] = quality[-1][extra]
            by_key[engine.key] = row
        reference = by_key.get(REFERENCE, {}).get("greedy_tokens")
        for row in by_key.values():
            row["greedy_prefix_vs_reference"] = (
                common_prefix(row["greedy_tokens"], reference) if reference else None
            )
            for base, name in ((LLAMA, "llama"), (GENAI_INT4, "genai_int4")):
                other = by_key.get(base)
                for metric, short in (
                    ("decode_tokens_per_s", "decode"),
                    ("prefill_tokens_per_s", "prefill"),
                    ("peak_rss_mb", "rss"),
                ):
                    mine = row.get(metric)
                    theirs = other.get(metric) if other else None
                    row[f"{short}_vs_{name}"] = mine / theirs if mine and theirs else None
            rows.append(row)
    return rows


# -- reporting -------------------------------------------------------------------------------


def fmt(value, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[dict], meta: dict) -> str:
    """The results as markdown tables, one per thread count (for docs/benchmarks.md)."""
    lines = [
        f"SmolLM2-135M-Instruct, {meta['prompt_tokens']}-token chat prompt, "
        f"{meta['new_tokens']} greedy tokens with EOS ignored; medians of {meta['rounds']} "
        "rounds, engines alternated round-robin, a fresh process per run "
        f"({meta['machine']}, {meta['cores']} cores; median 1-min load average after a run: "
        f"{fmt(meta['loadavg_1min_median'], '.1f')}).",
        "",
    ]
    for threads in meta["threads"]:
        lines += [
            f"**{threads} thread{'s' if threads > 1 else ''}**",
            "",
            "| engine | decode tok/s | prefill tok/s | peak RSS MB | load s "
            "| decode vs llama.cpp | decode vs genai int4 | prefill vs genai int4 "
            "| RSS vs genai int4 | greedy = fp32 ref |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in (r for r in rows if r["threads"] == threads):
            prefix = row["greedy_prefix_vs_reference"]
            agree = "—" if prefix is None else f"{prefix}/{len(row['greedy_tokens'])}"
            lines.append(
                f"| {row['label']} | {fmt(row['decode_tokens_per_s'])} "
                f"| {fmt(row['prefill_tokens_per_s'], '.0f')} | {fmt(row['peak_rss_mb'], '.0f')} "
                f"| {fmt(row['load_s'], '.2f')} | {fmt(row['decode_vs_llama'], '.2f', 'x')} "
                f"| {fmt(row['decode_vs_genai_int4'], '.2f', 'x')} "
                f"| {fmt(row['prefill_vs_genai_int4'], '.2f', 'x')} "
                f"| {fmt(row['rss_vs_genai_int4'], '.2f', 'x')} "
                f"| {agree} |"
            )
        lines.append("")
    quality = [r for r in rows if r["threads"] == meta["threads"][0] and "perplexity" in r]
    if quality:
        lines += [
            "**Quality** (each engine's output: perplexity of `ortgen bench`'s evaluation "
            "text, teacher-forced, and top-1 agreement with the fp32 reference "
            f"`{meta['reference']}` at each position)",
            "",
            "| engine | perplexity | reference perplexity | top-1 agreement |",
            "|---|---|---|---|",
        ]
        for row in quality:
            lines.append(
                f"| {row['label']} | {fmt(row.get('perplexity'), '.3f')} "
                f"| {fmt(row.get('reference_perplexity'), '.3f')} "
                f"| {fmt(row.get('agreement_top1') and 100 * row['agreement_top1'], '.1f', '%')} |"
            )
        lines.append("")
    return "\n".join(lines)


def chart(rows: list[dict], meta: dict, path: Path) -> None:
    """Decode, prefill and peak RSS per engine, one bar per thread count (Agg, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r["label"] for r in rows))
    threads_list = meta["threads"]
    panels = [
        ("decode_tokens_per_s", "decode tokens/s (higher is better)"),
        ("prefill_tokens_per_s", "prefill tokens/s (higher is better)"),
        ("peak_rss_mb", "peak RSS MB (lower is better)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.5 * len(labels) + 2.2), sharey=True)
    height = 0.8 / max(1, len(threads_list))
    for ax, (metric, title) in zip(axes, panels, strict=True):
        for j, threads in enumerate(threads_list):
            values = []
            for label in labels:
                match = [r for r in rows if r["label"] == label and r["threads"] == threads]
                values.append((match[0][metric] or 0) if match else 0)
            positions = [i + (j - (len(threads_list) - 1) / 2) * height for i in range(len(labels))]
            bars = ax.barh(positions, values, height=height, label=f"{threads} thread(s)")
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"SmolLM2-135M-Instruct, {meta['prompt_tokens']}-token prompt, {meta['new_tokens']} "
        f"greedy tokens, medians of {meta['rounds']} rounds ({meta['machine']})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ortgen_model(text: str) -> tuple[str, Path]:
    """``name=DIR`` for ``--ortgen-models``."""
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected name=DIR, got {text!r}")
    path = Path(folder)
    return name, path if path.is_absolute() else (Path.cwd() / path).resolve()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--engines",
        nargs="+",
        help=f"keys or prefixes: {', '.join(PEER_KEYS)}, ortgen (all ortgen columns)",
    )
    parser.add_argument(
        "--ortgen-models",
        nargs="+",
        type=ortgen_model,
        default=[("ortgen", DEFAULT_MODEL)],
        metavar="NAME=DIR",
        help="ortgen model folders, one column each (default: the default model as 'ortgen')",
    )
    parser.add_argument("--ortgen-mode", choices=["auto", "cli", "loop"], default="auto")
    parser.add_argument(
        "--reference",
        default=str(MODELS / "optimum-fp32"),
        help="fp32 ortgen folder for `ortgen bench`'s top-1 agreement (the quality pass)",
    )
    parser.add_argument(
        "--no-quality", action="store_true", help="skip the one quality run per engine"
    )
    parser.add_argument(
        "--eval-tokens", type=int, help="score only this many tokens of the evaluation text"
    )
    parser.add_argument("--prompt-ids", help="JSON list of token ids (default: the chat prompt)")
    parser.add_argument("--main-python", default=str(MAIN_PY))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--chart", default=str(CHART), help="PNG path ('' for none)")
    parser.add_argument("--out", help="JSON path (default: benchmarks/results/compare-TS.json)")
    args = parser.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / f"compare-{stamp}.json"
    engines = build_engines(args)
    for engine in engines:
        if engine.missing:
            log(f"skipping {engine.key}: {engine.missing}")
    runnable = [e for e in engines if not e.missing]
    if not runnable:
        log("nothing to run")
        sys.exit(1)

    if args.prompt_ids:
        prompt_file = Path(args.prompt_ids).resolve()
        prompt = json.loads(prompt_file.read_text())
    else:
        prompt_file = out.with_name(out.stem + "-prompt.json").resolve()
        prompt = render_prompt(Path(args.main_python), prompt_file)
    log(f"prompt: {len(prompt)} tokens ({prompt_file})")
    log("engines: " + ", ".join(f"{e.key} ({e.model})" for e in runnable))

    busy = os.getloadavg()[0]
    if busy > 0.5:
        log(f"load average {busy:.1f} before the first run: other work shares the cores")
    runs: list[dict] = []
    failures: dict[tuple[str, int], int] = {}
    for round_index in range(args.rounds):
        shift = round_index % len(runnable)
        order = runnable[shift:] + runnable[:shift]  # rotate: no engine always runs first
        for threads in args.threads:
            for engine in order:
                if failures.get((engine.key, threads), 0) >= 2:
                    continue
                outcome = run_once(engine, prompt_file, args, threads)
                record = {
                    "round": round_index,
                    "threads": threads,
                    "engine": engine.key,
                    "loadavg_1min_after": os.getloadavg()[0],  # to spot a busy machine
                }
                if isinstance(outcome, str):
                    failures[(engine.key, threads)] = failures.get((engine.key, threads), 0) + 1
                    record["error"] = outcome
                    log(f"round {round_index + 1} t={threads} {engine.key}: FAILED {outcome}")
                else:
                    record["result"] = outcome
                    log(
                        f"round {round_index + 1} t={threads} {engine.key:<16} decode "
                        f"{fmt(outcome.get('decode_tokens_per_s'), '7.1f')} tok/s  prefill "
                        f"{fmt(outcome.get('prefill_tokens_per_s'), '6.0f')} tok/s  RSS "
                        f"{fmt(outcome.get('peak_rss_mb'), '5.0f')} MB  load "
                        f"{fmt(outcome.get('load_s'), '.2f')} s"
                    )
                runs.append(record)

    if not args.no_quality:
        quality_pass(runnable, prompt_file, args, runs)
    rows = summarise(runnable, runs, args.threads)
    meta = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": cpu_name(),
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt),
        "prompt_ids": prompt,
        "reference": args.reference,
        "loadavg_1min_median": median([r.get("loadavg_1min_after") for r in runs]),
        "engines": {e.key: {"label": e.label, "model": str(e.model)} for e in runnable},
        "skipped": {e.key: e.missing for e in engines if e.missing},
        "versions": {
            "main": versions(Path(args.main_python)),
            "peers": versions(PEERS_PY),
        },
    }
    write_results(out, meta, rows, runs, markdown(rows, meta))
    log(f"written {out} and {out.with_suffix('.md')}")
    if args.chart and rows:
        chart(rows, meta, Path(args.chart))
        log(f"written {args.chart}")


if __name__ == "__main__":
    main()
