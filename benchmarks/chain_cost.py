"""Cost per token of the decoding chain (processors + sampler), without the model.

The common chat setting (repetition_penalty 1.1, temperature 0.7, top_k 50, top_p 0.9,
multinomial) at SmolLM2's vocabulary (49,152), batch 1, with a growing context: the goal
is at most 0.15 ms per token (at 200 tokens/s a step is 5 ms, and the loop's whole
Python budget is 2% of it). Other settings are printed beside it for scale.

    python benchmarks/chain_cost.py [--vocab 49152] [--batch 1] [--steps 400] [--cold-mb 16]

``--cold-mb`` touches a buffer of that size before each step, as a model forward sweeps
the caches between two chains: closer to the loop, and slower.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from sweep import write_report

import ortgen
from ortgen import scoring
from ortgen.config import resolve
from ortgen.plugin_host.chains import build_chain
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
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
    "top_k 40 + top_n_sigma + xtc": dict(
        do_sample=True, top_k=40, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.1
    ),
    "typical_p": dict(do_sample=True, top_k=0, typical_p=0.9),
    "mirostat v2": dict(do_sample=True, top_k=0, mirostat=2),
    "mirostat v2 after top_k 50": dict(do_sample=True, mirostat=2),
}


def chain_ms(
    settings: dict, vocab: int, batch: int, steps: int, prompt: int = 200, cold_mb: int = 0
) -> tuple[float, dict[str, float]]:
    """Median milliseconds per step of processors + sampler, on realistic logits.

    Timed on the loop's own path (``ortgen.loop.scoring``: after top-k the scores travel as
    Candidates), as a whole and per component (processors by name, then the
    sampler), so that a regression can be traced to its component without a
    profiler. The medians of the parts need not add up to the median of the whole.
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
    # touched before each step, as a model forward sweeps the caches between two chains
    sweep = np.zeros(cold_mb * 2**18, dtype=np.float32)
    parts: dict[str, list[float]] = {name: [] for name, _ in chain.processors}
    parts[chain.sampler[0]] = []
    spent: dict[str, float] = {}

    def timed(kind: str, name: str, function, input_ids, scores):
        started = time.perf_counter()
        result = function(input_ids, scores)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
        return result

    times: list[float] = []
    for step in range(steps):
        scores = base + rng.standard_normal((batch, vocab)).astype(np.float32) * 0.1
        sweep += 1.0
        input_ids = ids[:, : prompt + step]
        # the loop's own path: scores stay Candidates after top-k for the components
        # that take them (framework/scoring.py)
        started = time.perf_counter()
        scoring.pick(chain.sampler, input_ids, scoring.process(chain.processors, input_ids, scores))
        times.append(time.perf_counter() - started)
        spent.clear()  # again, each component timed on its own
        processed = scoring.process(chain.processors, input_ids, scores, call=timed)
        scoring.pick(chain.sampler, input_ids, processed, call=timed)
        for name, seconds in spent.items():
            parts[name].append(seconds)
    share = {name: 1e3 * statistics.median(spent) for name, spent in parts.items()}
    return 1e3 * statistics.median(times), share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--cold-mb", type=int, default=0, help="touch this many MB before each step (a forward)"
    )
    parser.add_argument("--out", default="benchmarks/results/chain_cost.json")
    args = parser.parse_args()
    report = {"vocab": args.vocab, "batch": args.batch, "ortgen": ortgen.__version__}
    for name, settings in SETTINGS.items():
        ms, share = chain_ms(settings, args.vocab, args.batch, args.steps, cold_mb=args.cold_mb)
        report[name] = ms
        report[f"{name}: components"] = share
        print(f"{name:28s} {ms:6.3f} ms per token")
        print("    " + ", ".join(f"{part} {part_ms:.3f}" for part, part_ms in share.items()))
    write_report(args.out, report)


if __name__ == "__main__":
    main()
