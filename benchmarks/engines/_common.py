"""What every engine runner shares: the command line, the prompt ids and the one JSON line.

Stdlib only, on purpose: each runner is a fresh process that imports exactly one engine, so
its peak RSS is that engine's; this module must add nothing measurable to it.

Every runner is called as::

    python run_X.py --model PATH --prompt-ids FILE --new-tokens K --threads T

and prints one JSON line with ``engine``, ``decode_tokens_per_s``, ``prefill_tokens_per_s``,
``peak_rss_mb``, ``load_s`` and ``greedy_tokens``. Conventions shared by all of them:

- ``load_s``: from just before the engine's import to a model ready to run (interpreter
  start-up excluded: it is the same for every Python runner).
- prefill: the prompt forward *and* the pick of the first new token; ``prefill_tokens_per_s``
  is prompt tokens / that time.
- decode: the remaining ``K - 1`` tokens, one forward each; ``decode_tokens_per_s`` is
  ``(K - 1)`` / that time.
- greedy (argmax) over the whole vocabulary with EOS ignored: an EOS token may be picked and
  generation goes on, so every engine produces exactly ``K`` tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

START = time.perf_counter()


def parse_args(description: str) -> argparse.Namespace:
    """The command line every runner takes (compare.py builds it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, help="model file or folder for this engine")
    parser.add_argument("--prompt-ids", required=True, help="JSON file: a list of token ids")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", help="name to report (default: the runner's own)")
    parser.add_argument(
        "--eval-ids",
        help="JSON file of token ids: instead of timing, teacher-force them and report the "
        "perplexity and each position's top-1 (the quality pass; not every runner has it)",
    )
    return parser.parse_args()


def limit_threads(threads: int) -> None:
    """Cap the OpenMP/BLAS pools too, before any engine is imported (torch reads them)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)


def read_prompt(path: str) -> list[int]:
    """The shared prompt: the same ids for every engine, so no tokenizer differs."""
    ids = json.loads(Path(path).read_text())
    if isinstance(ids, dict):
        ids = ids["prompt_ids"]
    return [int(i) for i in ids]


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(
    engine: str,
    *,
    prompt_tokens: int,
    tokens: list[int],
    load_s: float,
    prefill_s: float,
    decode_s: float,
    **extra: object,
) -> None:
    """Print the one JSON line compare.py reads (the last line of stdout that parses)."""
    decode_steps = len(tokens) - 1
    result = {
        "engine": engine,
        "decode_tokens_per_s": decode_steps / decode_s if decode_s > 0 else None,
        "prefill_tokens_per_s": prompt_tokens / prefill_s if prefill_s > 0 else None,
        "decode_ms_per_token": 1e3 * decode_s / decode_steps if decode_steps else None,
        "first_token_s": prefill_s,
        "peak_rss_mb": peak_rss_mb(),
        "load_s": load_s,
        "prompt_tokens": prompt_tokens,
        "new_tokens": len(tokens),
        "greedy_tokens": [int(t) for t in tokens],
        **extra,
    }
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def emit_quality(engine: str, rows, targets: list[int]) -> None:
    """The quality pass's JSON line: ``rows`` yields the logits over the vocabulary that
    predict each of ``targets`` in turn; the perplexity and each position's top-1, computed
    as ``ortgen.bench.quality.score_tokens`` does (log-sum-exp in float64). numpy is
    imported here only: the quality pass is not a timed run, its RSS is not reported."""
    import numpy as np

    nll = np.empty(len(targets))
    top1 = []
    for position, (row, target) in enumerate(zip(rows, targets, strict=True)):
        values = np.asarray(row, dtype=np.float64).reshape(-1)
        peak = values.max()
        nll[position] = peak + np.log(np.exp(values - peak).sum()) - values[target]
        top1.append(int(values.argmax()))
    result = {
        "engine": engine,
        "perplexity": float(np.exp(nll.mean())),
        "eval_tokens": len(targets) + 1,
        "top1": top1,
    }
    print(json.dumps(result), flush=True)


class TimingStreamer:
    """A duck-typed transformers streamer: splits ``generate()`` into prefill and decode.

    ``generate`` calls ``put`` once with the prompt before any forward, then once per new
    token, and ``end`` at the end, so the first new token's time is the prefill and the rest
    is decode, measured on the library's own loop with no hook inside it.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) > 1:
            self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self) -> None:
        pass

    def split(self) -> tuple[float, float]:
        """(prefill_s, decode_s) from the recorded times."""
        return self.times[1] - self.times[0], self.times[-1] - self.times[1]


def greedy_generate_and_emit(torch, model, prompt: list[int], args, engine: str, load_s: float):
    """Both Hugging Face ``generate`` runners (optimum's ORT model, transformers' PyTorch
    model): greedy, EOS ignored, timed by the streamer; ``torch`` is passed in so this
    module stays stdlib-only."""
    ids = torch.tensor([prompt])
    streamer = TimingStreamer()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            streamer=streamer,
        )
    prefill_s, decode_s = streamer.split()
    emit(
        args.engine or engine,
        prompt_tokens=len(prompt),
        tokens=streamer.tokens,
        load_s=load_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
    )
