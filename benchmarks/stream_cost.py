"""Streaming cost per token at the start and the end of a long answer.

Everything ortgen does per token besides the model's forward (the loop, detokenizing,
stop-string search, what streaming may show) must not grow with the answer: token 4,000
should cost what token 100 costs. Two measurements:

1. the text path alone (``RowText``: detokenize, search stop strings, hold back a
   possible stop start), over 4,000 real tokens of the default model's tokenizer, per
   token in tokens 100-200 and 3,900-4,000; beside it the whole-text approach ortgen
   used before (re-search and re-join the whole text per token), for contrast;
2. with ``--generate``: a real 4,000-token stream of the default model (EOS ignored),
   timing everything per step except ``session.run`` (whose attention grows with the
   context by the math, not by ortgen).

    python benchmarks/stream_cost.py [--generate] [--tokens 4000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sweep import write_report

import ortgen
from ortgen.text import RowText
from ortgen.text.detokenizer import IncrementalDetokenizer
from ortgen.text.stop_strings import StopStringMatcher

STOPS = ["\n\nUser:", "<|im_end|>"]


class WholeTextRow:
    """The text path as it was: the whole text re-joined and re-searched per token."""

    def __init__(self, tokenizer, stops) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._matcher = StopStringMatcher(stops)
        self.text = ""
        self.shown = 0

    def push(self, token: int) -> str:
        searched = len(self.text)
        self.text += self._detokenizer.push(token)
        self._matcher.find(self.text, searched)
        safe = self._matcher.safe_length(self.text)
        piece, self.shown = self.text[self.shown : safe], max(self.shown, safe)
        return piece


def _per_token_us(push, ids: list[int], windows: list[tuple[int, int]]) -> list[float]:
    """Microseconds per token inside each window of positions."""
    marks = {}
    for i, tid in enumerate(ids):
        if i in {a for a, _ in windows} | {b for _, b in windows}:
            marks[i] = time.perf_counter()
        push(tid)
    marks[len(ids)] = time.perf_counter()
    return [1e6 * (marks[b] - marks[a]) / (b - a) for a, b in windows]


def text_path(gen, n: int, rounds: int = 7) -> dict:
    text = gen.tokenizer.decode(gen.tokenizer.encode(_eval_text()))
    ids: list[int] = []
    while len(ids) < n:
        ids += gen.tokenizer.encode(text, add_special_tokens=False)
    ids = ids[:n]
    windows = [(100, 200), (n - 100, n)]
    report = {}
    for name, make in (
        ("row_text", lambda: RowText(gen.tokenizer, STOPS)),
        ("whole_text_before", lambda: WholeTextRow(gen.tokenizer, STOPS)),
    ):
        runs = []
        for _ in range(rounds):
            row = make()
            push = (lambda t, r=row: (r.push(t), r.take())) if name == "row_text" else row.push
            runs.append(_per_token_us(push, ids, windows))
        start = statistics.median(r[0] for r in runs)
        end = statistics.median(r[1] for r in runs)
        report[name] = {
            "us_per_token_at_100": start,
            f"us_per_token_at_{n}": end,
            "ratio": end / start,
        }
        print(
            f"{name:18s} token 100: {start:7.1f} us   token {n}: {end:7.1f} us   "
            f"ratio {end / start:.2f}"
        )
    return report


def generate_path(gen, n: int) -> dict:
    """Per-step time outside session.run, from a real stream of ``n`` tokens."""
    model = gen.model
    run = model.session.run_with_iobinding
    inside: list[float] = []

    def timed(*args, **kwargs):
        started = time.perf_counter()
        out = run(*args, **kwargs)
        inside.append(time.perf_counter() - started)
        return out

    model.session.run_with_iobinding = timed
    steps: list[float] = []
    state = gen.start(
        "Count from 1 to 10000, one number per line:",
        max_new_tokens=n,
        eos_token_id=None,
        stop_strings=STOPS,
    )
    while not state.is_done:
        started = time.perf_counter()
        before = len(inside)
        state.step()
        state.new_text(0)
        steps.append(time.perf_counter() - started - sum(inside[before:]))
    model.session.run_with_iobinding = run
    start = 1e6 * statistics.median(steps[100:200])
    end = 1e6 * statistics.median(steps[-100:])
    print(
        f"outside session.run  token 100: {start:7.1f} us   token {n}: {end:7.1f} us   "
        f"ratio {end / start:.2f}"
    )
    return {"us_per_step_at_100": start, f"us_per_step_at_{n}": end, "ratio": end / start}


def _eval_text() -> str:
    from importlib.resources import files

    return files("ortgen").joinpath("data/eval_text.txt").read_text(encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="exported model folder (default: the built-in model)")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--generate", action="store_true", help="also stream with the model")
    parser.add_argument("--out", default="benchmarks/results/stream_cost.json")
    args = parser.parse_args()
    gen = ortgen.load(args.model, threads=1)
    report = {"tokens": args.tokens, "text_path": text_path(gen, args.tokens)}
    if args.generate:
        report["generate"] = generate_path(gen, args.tokens)
    write_report(args.out, report)


if __name__ == "__main__":
    main()
