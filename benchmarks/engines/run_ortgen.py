"""ortgen on one exported model folder: through ``ortgen bench --json`` when it exists.

Runs in the main venv. ``--mode cli`` runs ``ortgen bench --json --model DIR --threads T
--prompt-ids FILE --new-tokens K --no-do-sample`` in this process (``ortgen.cli.main``: the
peak RSS and the timings are the bench command's own, this runner imports only the
stdlib besides). Speed runs add ``--no-quality``: the quality pass (perplexity, and
teacher-forced top-1 agreement with ``--reference``) is the same for every run, so
compare.py asks for it once per model with ``--quality``; bench takes its peak RSS before
that pass either way. bench's ``load_s`` starts at ``ortgen.load``, after ``import
ortgen``; the runner adds the import (``import_s``), so ``load_s`` starts before the
engine's import as every other runner's does.
``--mode loop`` is the stand-in for before that command existed: it drives
``ortgen.load(dir).start(ids, max_new_tokens=K, eos_token_id=None)`` and ``.step()``, timing
the first step (prefill + first token) and the rest (decode). ``--mode auto`` (default)
asks the CLI whether ``bench`` exists; compare.py asks once and passes the answer.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from _common import START, emit, limit_threads, parse_args, read_prompt


def ortgen_cli() -> Path:
    """The ``ortgen`` console script of the interpreter running this file."""
    return Path(sys.executable).parent / "ortgen"


def has_bench() -> bool:
    """True when this ortgen has the ``bench`` command (it is being written)."""
    cli = ortgen_cli()
    if not cli.exists():
        return False
    done = subprocess.run(
        [str(cli), "bench", "--help"], capture_output=True, text=True, check=False
    )
    return done.returncode == 0 and "--prompt-ids" in done.stdout


def split_own_options(argv: list[str]) -> tuple[dict, list[str]]:
    """Take ``--mode M``, ``--quality``, ``--reference DIR`` and ``--eval-tokens N`` out
    before the shared parser (which every runner uses and which knows nothing of them)."""
    own: dict = {"mode": "auto", "quality": False, "reference": None, "eval_tokens": None}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--mode":
            own["mode"] = next(items)
        elif item == "--reference":
            own["reference"] = next(items)
        elif item == "--eval-tokens":
            own["eval_tokens"] = next(items)
        elif item == "--quality":
            own["quality"] = True
        else:
            rest.append(item)
    return own, rest


def bench_in_process(command: list[str]) -> int:
    """``ortgen bench`` through ``ortgen.cli.main`` in this process, its JSON re-printed
    with the import of ortgen counted in ``load_s`` (``import_s`` apart)."""
    import contextlib
    import io
    import json

    from ortgen.cli import main as ortgen_main

    import_s = time.perf_counter() - START
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = ortgen_main(command)
    text = out.getvalue().strip()
    if status != 0 or not text:
        print(text)
        return status or 1
    report = json.loads(text.splitlines()[-1])
    report["import_s"] = round(import_s, 3)
    report["load_s"] = round(import_s + report["load_s"], 3)
    print(json.dumps(report), flush=True)
    return 0


def main() -> None:
    own, rest = split_own_options(sys.argv[1:])
    sys.argv[1:] = rest
    args = parse_args(__doc__.splitlines()[0])
    limit_threads(args.threads)
    mode = own["mode"]
    if mode == "cli" or (mode == "auto" and has_bench()):
        command = [
            "bench", "--json", "--model", args.model, "--threads", str(args.threads),
            "--prompt-ids", args.prompt_ids, "--new-tokens", str(args.new_tokens),
            "--no-do-sample",
        ]  # fmt: skip
        if own["quality"]:
            if own["reference"]:
                command += ["--reference", own["reference"]]
            if own["eval_tokens"]:
                command += ["--eval-tokens", own["eval_tokens"]]
        else:
            command.append("--no-quality")
        sys.exit(bench_in_process(command))

    prompt = read_prompt(args.prompt_ids)
    import ortgen

    gen = ortgen.load(args.model, threads=args.threads)
    load_s = time.perf_counter() - START
    state = gen.start(prompt, max_new_tokens=args.new_tokens, eos_token_id=None, do_sample=False)
    start = time.perf_counter()
    state.step()
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    while not state.is_done:
        state.step()
    decode_s = time.perf_counter() - start
    emit(
        args.engine or "ortgen",
        prompt_tokens=len(prompt),
        tokens=state.generated(0),
        load_s=load_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
        mode="loop",
    )


if __name__ == "__main__":
    main()
