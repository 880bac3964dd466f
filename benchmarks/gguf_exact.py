"""Lossless GGUF -> fused graph: exactness, speed and size against the builder's own int4 graphs.

Builds onnxruntime-genai's int4 graph (block 32, asymmetric RTN, shared embedding) from the
transformers folder the GGUF dequantises to, rewrites a copy with the GGUF's exact weights
(``ortgen.export.gguf_exact``) at accuracy level 0 and 4, and builds a block-128 graph too.

1. Exactness: teacher-forced logits on a 38-token prompt, all positions, against transformers
   PyTorch fp32 on the same folder (transformers' dequantisation is exact, so the level-0
   rewrite should differ by float rounding only): max |diff| and top-1 agreement.
2. Speed: an IOBinding decode loop (shared past/present buffers, 38-token prompt, 128 greedy
   tokens), a fresh process per run, variants alternated round-robin: decode and prefill
   tokens/s and peak RSS, medians.
3. Model file size.

    python benchmarks/gguf_exact.py [--gguf FILE] [--hf DIR] [--work DIR] [--runs 3]
    python benchmarks/gguf_exact.py --loop MODEL.onnx [--threads 1]   # one timing run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "exported_models/.cache/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILDER_OPTIONS = ["shared_embeddings=true", "int4_algo_config=rtn", "int4_is_symmetric=false"]
MESSAGES = [{"role": "user", "content": "Explain in two sentences why the sky looks blue."}]
PROMPT_TOKENS = 38
NEW_TOKENS = 128


def load_rewrite() -> Any:
    """The rewrite function, imported by path while ``ortgen.export`` may still be moving."""
    try:
        from ortgen.export.gguf_exact import rewrite_with_gguf_weights
    except ImportError:
        path = ROOT / "framework/export/gguf_exact.py"
        spec = importlib.util.spec_from_file_location("ortgen.export.gguf_exact", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rewrite_with_gguf_weights = module.rewrite_with_gguf_weights
    return rewrite_with_gguf_weights


def build(hf: Path, out: Path, cache: Path, extra: list[str]) -> float:
    """Run onnxruntime-genai's builder (int4, CPU); its chatter goes to OUT.log. Seconds taken."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    cmd += ["-p", "int4", "-e", "cpu", "-c", str(cache), "--extra_options", *extra]
    start = time.perf_counter()
    with open(f"{out}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - start


def prompt_ids(hf: Path) -> np.ndarray:
    """A chat prompt cut or padded (with more of the same text) to exactly 38 tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    filler = tok.encode(" The quick brown fox jumps over the lazy dog." * 8)
    ids = (list(ids) + filler)[:PROMPT_TOKENS]
    return np.array([ids], dtype=np.int64)


def torch_logits(hf: Path, ids: np.ndarray) -> np.ndarray:
    """Teacher-forced fp32 logits of transformers PyTorch, all positions."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits[0].numpy()


def onnx_logits(model: Path, ids: np.ndarray) -> np.ndarray:
    """Teacher-forced logits of a builder graph: whole prompt in one run, empty past."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    feed: dict[str, np.ndarray] = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
    }
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values."):
            _, kv_heads, _, head_dim = inp.shape
            feed[inp.name] = np.zeros((1, kv_heads, 0, head_dim), np.float32)
    return sess.run(["logits"], feed)[0][0]


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Max |diff|, its ratio to the reference's range, top-1 agreement, mean KL(ref || got)."""
    diff = float(np.abs(ref - got).max())
    p, q = log_softmax(ref), log_softmax(got)
    return {
        "max_abs_diff": diff,
        "rel_to_range": diff / float(ref.max() - ref.min()),
        "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
        "kl_mean": float((np.exp(p) * (p - q)).sum(-1).mean()),
    }


def peak_rss_mb() -> float:
    """This process's peak RSS since exec (VmHWM).

    Not ``ru_maxrss``: Linux keeps it across exec, so a child forked from a parent holding
    torch would report the parent's 1.1 GB.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def loop(model: Path, threads: int) -> dict[str, float]:
    """One timing run (the brief's IOBinding loop): prefill 38 tokens, then 127 decode steps."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    start = time.perf_counter()
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - start
    past_inputs = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    kv_heads, head_dim = past_inputs[0].shape[1], past_inputs[0].shape[3]
    vocab = sess.get_outputs()[0].shape[-1]
    capacity = 256
    past = [
        ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kv_heads, capacity, head_dim), np.float32))
        for _ in past_inputs
    ]
    present = [i.name.replace("past_key_values.", "present.") for i in past_inputs]
    logits_buf = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1, vocab), np.float32))
    io = sess.io_binding()
    if "logits_to_keep" in {i.name for i in sess.get_inputs()}:  # ortgen's pruned LM head
        io.bind_cpu_input("logits_to_keep", np.ones(1, np.int64))

    def run(ids: np.ndarray, total: int) -> np.ndarray:
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", np.ones((1, total), np.int64))
        # logits first: get_outputs() follows binding order
        if ids.shape[1] == 1:
            io.bind_ortvalue_output("logits", logits_buf)
        else:
            io.bind_output("logits", "cpu")
        for inp, out, buf in zip(past_inputs, present, past, strict=True):
            io.bind_ortvalue_input(inp.name, buf)
            io.bind_ortvalue_output(out, buf)
        sess.run_with_iobinding(io)
        return io.get_outputs()[0].numpy() if ids.shape[1] > 1 else logits_buf.numpy()

    prompt = np.array([[1, *range(100, 100 + PROMPT_TOKENS - 1)]], dtype=np.int64)
    start = time.perf_counter()
    logits = run(prompt, prompt.shape[1])
    prefill = time.perf_counter() - start
    token, total, tokens = int(logits[0, -1].argmax()), prompt.shape[1], []
    start = time.perf_counter()
    for _ in range(NEW_TOKENS - 1):
        total += 1
        logits = run(np.array([[token]], np.int64), total)
        token = int(logits[0, -1].argmax())
        tokens.append(token)
    decode = time.perf_counter() - start
    return {
        "load_s": load,
        "prefill_tok_s": prompt.shape[1] / prefill,
        "decode_tok_s": (NEW_TOKENS - 1) / decode,
        "peak_rss_mb": peak_rss_mb(),
        "tokens": tokens[:8],
    }


def timed_runs(models: dict[str, Path], runs: int, threads: int) -> dict[str, list[dict]]:
    """Each variant ``runs`` times in fresh processes, alternated round-robin."""
    results: dict[str, list[dict]] = {name: [] for name in models}
    for _ in range(runs):
        for name, model in models.items():
            cmd = [sys.executable, __file__, "--loop", str(model), "--threads", str(threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument("--hf", type=Path, default=Path("/tmp/w/hf"), help="transformers folder")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gguf_exact_bench"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="reuse graphs already in --work")
    parser.add_argument("--loop", type=Path, help="internal: one timing run of this graph")
    args = parser.parse_args()
    if args.loop:
        print(json.dumps(loop(args.loop, args.threads)))
        return

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if not (args.hf / "config.json").is_file():
        try:
            from ortgen.export.gguf import gguf_to_hf_folder
        except ImportError:  # before the move to ortgen.export
            from ortgen.gguf import gguf_to_hf_folder

        gguf_to_hf_folder(args.gguf, args.hf)
    cache = work / "cache"
    dirs = {
        "builder int4 b32": work / "b32",
        "builder int4 b128": work / "b128",
        "gguf exact, level 4": work / "exact4",
        "gguf exact, level 0": work / "exact0",
    }
    rewrite = load_rewrite()
    reports = {}
    if not (args.reuse and (dirs["gguf exact, level 0"] / "model.onnx").is_file()):
        print(
            f"build b32: {build(args.hf, dirs['builder int4 b32'], cache, BUILDER_OPTIONS):.0f} s"
        )
        # The rtn algorithm fails at block 128 when K/128 is not whole (576: "cannot reshape
        # array of size 2400 into shape (960,newaxis)"); the builder's default int4 path works.
        extra = ["shared_embeddings=true", "int4_is_symmetric=false", "int4_block_size=128"]
        print(f"build b128: {build(args.hf, dirs['builder int4 b128'], cache, extra):.0f} s")
        for name, level in (("gguf exact, level 4", 4), ("gguf exact, level 0", 0)):
            shutil.rmtree(dirs[name], ignore_errors=True)
            shutil.copytree(dirs["builder int4 b32"], dirs[name])
            start = time.perf_counter()
            reports[name] = rewrite(dirs[name], args.gguf, accuracy_level=level)
            print(f"rewrite level {level}: {time.perf_counter() - start:.1f} s {reports[name]}")

    ids = prompt_ids(args.hf)
    ref = torch_logits(args.hf, ids)
    print(f"\n## Exactness: {ids.shape[1]} tokens, teacher-forced, all positions, vs PyTorch fp32")
    print("| graph | max abs diff | diff / logit range | top-1 agreement | mean KL |")
    print("|---|---|---|---|---|")
    for name, folder in dirs.items():
        got = onnx_logits(folder / "model.onnx", ids)
        c = compare(ref, got)
        print(
            f"| {name} | {c['max_abs_diff']:.2e} | {c['rel_to_range']:.2e} "
            f"| {c['top1_agreement']:.3f} | {c['kl_mean']:.2e} |"
        )

    timed = {k: v / "model.onnx" for k, v in dirs.items() if k != "gguf exact, level 0"}
    results = timed_runs(timed, args.runs, args.threads)
    print(f"\n## Speed: {args.threads} thread(s), {args.runs} alternated runs, medians (all runs)")
    print("| graph | decode tok/s | prefill tok/s | peak RSS MB | model MB |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        size = sum(f.stat().st_size for f in dirs[name].glob("model.onnx*")) / 1e6

        def fmt(key: str, runs: list[dict] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{statistics.median(values):.1f} ({' / '.join(f'{v:.0f}' for v in values)})"

        print(
            f"| {name} | {fmt('decode_tok_s')} | {fmt('prefill_tok_s')} "
            f"| {statistics.median(r['peak_rss_mb'] for r in runs):.0f} | {size:.1f} |"
        )
    (work / "results.json").write_text(json.dumps({"runs": results, "rewrite": reports}, indent=1))
    print(f"\nraw runs: {work / 'results.json'}  (pid {os.getpid()})")


if __name__ == "__main__":
    main()
