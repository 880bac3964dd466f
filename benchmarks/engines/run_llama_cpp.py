"""llama.cpp through llama-cpp-python on the Q4_1 GGUF itself: the reference CPU engine.

Runs in benchmarks/.venv-peers (llama-cpp-python built from its sdist with explicit SIMD
flags, see setup_peers.sh). Uses the library's own loop, ``Llama.generate`` with
``temp=0`` (llama.cpp's greedy sampler in C): ``generate`` never stops by itself, so EOS is
ignored simply by taking exactly K tokens. The first token's time is the prefill (the prompt
is evaluated in one batch); the other K - 1 are decode.

``--eval-ids FILE`` (compare.py's quality pass): the ids are evaluated with every
position's logits kept (``logits_all``), and the runner prints the perplexity and each
position's top-1 instead of timings.
"""

from __future__ import annotations

import time
from itertools import islice

from _common import START, emit, emit_quality, limit_threads, parse_args, read_prompt


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    limit_threads(args.threads)
    prompt = read_prompt(args.prompt_ids)

    from llama_cpp import Llama

    if args.eval_ids:
        ids = read_prompt(args.eval_ids)
        scorer = Llama(
            model_path=args.model, n_ctx=len(ids) + 8, n_batch=512, n_threads=args.threads,
            n_threads_batch=args.threads, logits_all=True, verbose=False,
        )  # fmt: skip
        scorer.eval(ids)
        rows = (scorer.scores[i] for i in range(len(ids) - 1))
        emit_quality(args.engine or "llama.cpp Q4_1", rows, ids[1:])
        return
    llm = Llama(
        model_path=args.model,
        n_ctx=max(256, len(prompt) + args.new_tokens + 8),
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    load_s = time.perf_counter() - START

    tokens = llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True)
    start = time.perf_counter()
    first = next(tokens)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    rest = list(islice(tokens, args.new_tokens - 1))
    decode_s = time.perf_counter() - start
    emit(
        args.engine or "llama.cpp Q4_1",
        prompt_tokens=len(prompt),
        tokens=[first, *rest],
        load_s=load_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
    )


if __name__ == "__main__":
    main()
