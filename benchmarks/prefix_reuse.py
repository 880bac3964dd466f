"""Two calls sharing a 400-token start with the ``prefix`` cache: how much the second
prefills, how long each prefill takes, and whether the tokens equal a fresh ``static``
run. Run from the repository root: ``python benchmarks/prefix_reuse.py``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import ortgen
from ortgen.bench.quality import eval_ids


def main() -> None:
    gen = ortgen.load(threads=1)
    text = eval_ids(gen)
    shared = text[:400]
    calls = [shared + text[600:620], shared + text[700:730]]
    settings = dict(max_new_tokens=32, do_sample=False, eos_token_id=None)
    rows = []
    for index, prompt in enumerate(calls, start=1):
        started = time.perf_counter()
        reused = gen.generate(prompt, cache="prefix", **settings)
        fresh = gen.generate(prompt, cache="static", **settings)
        rows.append(
            {
                "call": index,
                "prompt_tokens": len(prompt),
                "prefill_tokens": int(reused.stats["prefill_tokens"]),
                "prefill_s": round(reused.stats["prefill_s"], 3),
                "static_prefill_s": round(fresh.stats["prefill_s"], 3),
                "same_tokens_as_static": reused.tokens == fresh.tokens,
                "wall_s": round(time.perf_counter() - started, 2),
            }
        )
    out = Path("benchmarks/results/prefix_reuse.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(
        "| call | prompt tokens | prefill tokens fed | prefill s (prefix) "
        "| prefill s (static) | same tokens as static |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['call']} | {r['prompt_tokens']} | {r['prefill_tokens']} | {r['prefill_s']} "
            f"| {r['static_prefill_s']} | {'yes' if r['same_tokens_as_static'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
