"""onnxruntime-genai 0.18's own C++ generation loop on a folder made by its model builder.

Runs in benchmarks/.venv-peers. Greedy through ``og.Generator`` (``do_sample=False``),
``max_length`` = prompt + new tokens so the shared KV buffer is not sized for the model's
8192 positions. EOS ignored: 0.18's greedy search marks a row done as soon as the picked
token is in ``model.eos_token_id`` (search.cpp, ``SetNextToken``) and then pads. 0.18
refuses an out-of-vocabulary id (-1), and ``min_length`` would mask EOS out of the argmax
(changing the tokens where EOS wins), so the config is overlaid with an EOS id that a chat
answer never produces: SmolLM2's ``<gh_stars>`` (7), a code-pretraining marker. Should it
ever be picked, the run stops early and reports ``stopped_early`` with fewer tokens.
Threads: the decoder session's ``intra_op_num_threads``, overlaid the same way. Prefill is
``append_tokens(prompt)`` (the prompt forward) plus the first ``generate_next_token`` (the
argmax); each later ``generate_next_token`` runs one decode forward and picks the next token.

``--eval-ids FILE`` (compare.py's quality pass): the ids are teacher-forced one token per
forward (``append_tokens`` then ``get_logits``), as ``ortgen bench`` scores, and the runner
prints the perplexity and each position's top-1 instead of timings.
"""

from __future__ import annotations

import json
import time

from _common import START, emit, emit_quality, limit_threads, parse_args, read_prompt

#: the stand-in EOS id (see the module docstring): ``<gh_stars>`` in SmolLM2's vocabulary
NEVER_PICKED = 7


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    limit_threads(args.threads)
    prompt = read_prompt(args.prompt_ids)

    import onnxruntime_genai as og

    if args.eval_ids:
        quality(og, args)
        return

    config = og.Config(args.model)
    config.clear_providers()  # CPU
    options = {"intra_op_num_threads": args.threads, "inter_op_num_threads": 1}
    config.overlay(
        json.dumps(
            {"model": {"eos_token_id": [NEVER_PICKED], "decoder": {"session_options": options}}}
        )
    )
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(prompt) + args.new_tokens, do_sample=False, min_length=0
    )
    generator = og.Generator(model, params)
    load_s = time.perf_counter() - START

    start = time.perf_counter()
    generator.append_tokens(prompt)
    generator.generate_next_token()
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.new_tokens - 1):
        if generator.is_done():
            break
        generator.generate_next_token()
    decode_s = time.perf_counter() - start
    tokens = [int(t) for t in generator.get_sequence(0)[len(prompt) :]]
    emit(
        args.engine or "onnxruntime-genai",
        prompt_tokens=len(prompt),
        tokens=tokens,
        load_s=load_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
        stopped_early=len(tokens) < args.new_tokens,
    )


def quality(og, args) -> None:
    """Teacher-force ``--eval-ids`` through the graph, one token per forward."""
    ids = read_prompt(args.eval_ids)
    config = og.Config(args.model)
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, do_sample=False, min_length=0)
    generator = og.Generator(model, params)

    def rows():
        for token in ids[:-1]:
            generator.append_tokens([token])
            yield generator.get_logits()[0, -1]

    emit_quality(args.engine or "onnxruntime-genai", rows(), ids[1:])


if __name__ == "__main__":
    main()
