"""Output agreement: ortgen's tokens and logits against transformers (PyTorch) on the same weights.

Speed and memory are only half a report: an optimisation that changes the output must
say by how much. For the default model this loads the same GGUF into transformers and
compares (1) greedy tokens, (2) teacher-forced argmax agreement over ortgen's sequence,
(3) the largest absolute logit difference on that sequence.

    python benchmarks/agreement.py [--model DIR] [--new-tokens 128]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sweep import write_report
from transformers import AutoModelForCausalLM

import ortgen
from ortgen.gguf.default_model import download_default_gguf

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/agreement.json")
    args = parser.parse_args()

    gen = ortgen.load(args.model, threads=1)
    gguf = download_default_gguf(gen.path.parent / ".cache")
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    prompt = gen.chat_prompt(MESSAGES)

    ours = gen.generate(prompt, max_new_tokens=args.new_tokens, eos_token_id=None).tokens[0]
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=args.new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, len(prompt) :].tolist()
        sequence = torch.tensor([prompt + ours])
        torch_logits = hf(sequence).logits[0].numpy()
    model = gen.model
    empty = {
        name: np.zeros((1, model.signature.num_kv_heads, 0, model.signature.head_dim), np.float32)
        for name in model.signature.past_inputs
    }
    ids = sequence.numpy()
    onnx_logits, _ = model.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None], empty)
    onnx_logits = onnx_logits[0]

    span = slice(len(prompt) - 1, len(prompt) + len(ours) - 1)  # positions that predict ours
    same_prefix = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), len(ours)
    )
    teacher_forced = float((torch_logits[span].argmax(-1) == np.asarray(ours)).mean())
    report = {
        "model": str(gen.path),
        "new_tokens": len(ours),
        "greedy_tokens_equal": same_prefix,
        "teacher_forced_argmax_agreement": teacher_forced,
        "max_abs_logit_diff": float(np.abs(onnx_logits - torch_logits).max()),
    }
    print(f"greedy tokens equal to transformers  {same_prefix}/{len(ours)}")
    print(f"teacher-forced argmax agreement      {100 * teacher_forced:.1f}%")
    print(f"max |logit difference|               {report['max_abs_logit_diff']:.2e}")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
