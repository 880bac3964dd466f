"""transformers PyTorch fp32 on the transformers folder made from the GGUF: the reference.

Runs in the main venv. Its greedy tokens are the fp32 reference that compare.py measures
every engine's agreement against (the same weights, dequantised from the Q4_1 GGUF).
Greedy, ``eos_token_id=None`` (EOS ignored), ``torch.set_num_threads``; prefill and decode
are split by a streamer.
"""

from __future__ import annotations

import time

from _common import START, greedy_generate_and_emit, limit_threads, parse_args, read_prompt


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    limit_threads(args.threads)
    prompt = read_prompt(args.prompt_ids)

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    load_s = time.perf_counter() - START

    greedy_generate_and_emit(torch, model, prompt, args, "transformers PyTorch fp32", load_s)


if __name__ == "__main__":
    main()
