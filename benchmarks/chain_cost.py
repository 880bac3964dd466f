"""Cost per token of the decoding chain (processors + sampler), without the model.

The common chat setting (repetition_penalty 1.1, temperature 0.7, top_k 50, top_p 0.9,
multinomial) at SmolLM2's vocabulary (49,152), batch 1, with a growing context: the goal
is at most 0.15 ms per token (at 200 tokens/s a step is 5 ms, and the loop's whole
Python budget is 2% of it). Other settings are printed beside it for scale.

    python benchmarks/chain_cost.py [--vocab 49152] [--batch 1] [--steps 400]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from sweep import write_report

import ortgen
from ortgen.chain import build_chain
from ortgen.config import resolve
from ortgen.plugin_manager import build_registry, make_plugin_manager
from ortgen.testing import make_context

SETTINGS = {
    "chat (goal <= 0.15 ms)": dict(
        do_sample=True, repetition_penalty=1.1, temperature=0.7, top_k=50, top_p=0.9
    ),
    "greedy": dict(do_sample=False),
    "sampling, no cut": dict(do_sample=True, top_k=0),
    "min_p + penalties": dict(
        do_sample=True, top_k=0, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.3
    ),
    "top_n_sigma + xtc": dict(
        do_sample=True, top_k=0, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.1
    ),
    "typical_p": dict(do_sample=True, top_k=0, typical_p=0.9),
    "mirostat v2": dict(do_sample=True, top_k=0, mirostat=2),
}


def chain_ms(
    settings: dict, vocab: int, batch: int, steps: int, prompt: int = 200
) -> tuple[float, dict[str, float]]:
    """Median milliseconds per step of processors + sampler, on realistic logits.

    Also the median of each component (processors by name, then the sampler), so
    that a regression can be traced to its component without a profiler. The
    medians of the parts need not add up to the median of the whole.
    """
    rng = np.random.default_rng(0)
    config = resolve([("call", {"seed": 0, **settings})]).config
    ctx = make_context(
        config=config,
        batch_size=batch,
        vocab_size=vocab,
        prompt_length=prompt,
        max_length=prompt + steps,
    )
    chain = build_chain(build_registry(make_plugin_manager()), ctx, cache=("unused", None))
    ids = rng.integers(0, vocab, (batch, prompt + steps)).astype(np.int64)
    # logits shaped like a language model's: a heavy head over a long flat tail
    base = (rng.standard_normal((batch, vocab)) * 2.0).astype(np.float32)
    components = [*chain.processors, chain.sampler]
    times: list[float] = []
    parts: dict[str, list[float]] = {name: [] for name, _ in components}
    for step in range(steps):
        scores = base + rng.standard_normal((batch, vocab)).astype(np.float32) * 0.1
        input_ids = ids[:, : prompt + step]
        total = 0.0
        for name, component in components:
            started = time.perf_counter()
            result = component(input_ids, scores)
            elapsed = time.perf_counter() - started
            parts[name].append(elapsed)
            total += elapsed
            scores = result  # the sampler's token ids are not read
        times.append(total)
    share = {name: 1e3 * statistics.median(spent) for name, spent in parts.items()}
    return 1e3 * statistics.median(times), share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default="benchmarks/results/chain_cost.json")
    args = parser.parse_args()
    report = {"vocab": args.vocab, "batch": args.batch, "ortgen": ortgen.__version__}
    for name, settings in SETTINGS.items():
        ms, share = chain_ms(settings, args.vocab, args.batch, args.steps)
        report[name] = ms
        report[f"{name}: components"] = share
        print(f"{name:28s} {ms:6.3f} ms per token")
        print("    " + ", ".join(f"{part} {part_ms:.3f}" for part, part_ms in share.items()))
    write_report(args.out, report)


if __name__ == "__main__":
    main()
