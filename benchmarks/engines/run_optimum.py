"""optimum's ``ORTModelForCausalLM`` (onnxruntime, fp32) driven by transformers' ``generate``.

Runs in the main venv on an optimum-graph folder exported by ortgen (the same graph the
default ortgen model used before the fused variants), so it shows what the stock Hugging
Face stack gets out of onnxruntime. Greedy, ``eos_token_id=None`` (EOS ignored), threads via
the session's ``intra_op_num_threads``; prefill and decode are split by a streamer.
"""

from __future__ import annotations

import time

from _common import START, TimingStreamer, emit, limit_threads, parse_args, read_prompt


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

    ids = torch.tensor([prompt])
    streamer = TimingStreamer()
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
        args.engine or "optimum ORT fp32",
        prompt_tokens=len(prompt),
        tokens=streamer.tokens,
        load_s=load_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
    )


if __name__ == "__main__":
    main()
