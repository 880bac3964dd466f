"""optimum's ``ORTModelForCausalLM`` (onnxruntime, fp32) driven by transformers' ``generate``.

Runs in the main venv on an optimum-graph folder exported by ortgen (the same graph the
default ortgen model used before the fused variants), so it shows what the stock Hugging
Face stack gets out of onnxruntime. Greedy, ``eos_token_id=None`` (EOS ignored), threads via
the session's ``intra_op_num_threads``; prefill and decode are split by a streamer.
"""

from __future__ import annotations

import time

from _common import START, greedy_generate_and_emit, limit_threads, parse_args, read_prompt


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    limit_threads(args.threads)
    prompt = read_prompt(args.prompt_ids)

    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    model = ORTModelForCausalLM.from_pretrained(
        args.model, session_options=options, provider="CPUExecutionProvider", use_cache=True
    )
    load_s = time.perf_counter() - START

    greedy_generate_and_emit(torch, model, prompt, args, "optimum ORT fp32", load_s)


if __name__ == "__main__":
    main()
