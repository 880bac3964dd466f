"""``ortgen generate PROMPT``: stream a continuation of a plain prompt."""

from __future__ import annotations

import argparse
import sys

from .args import add_generation_flags, add_model_flags, load_generator, settings_of
from .structured import add_structured_flags, warn_if_not_json


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="stream a continuation of a prompt")
    p.add_argument("prompt")
    add_model_flags(p)
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_generate, one_shot=True)


def cmd_generate(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    gen = load_generator(args)
    state = gen.start(args.prompt, **settings)
    text = ""
    try:
        for piece in gen.stream_state(state):
            if piece:
                print(piece, end="", flush=True)
            text += piece
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return 130
    print()
    warn_if_not_json(gen.resolve_config(settings).config, text, state.finish_reasons[0])
    if not text:
        reason = state.finish_reasons[0]
        print(
            f"ortgen: note: the model ended at once without any text (finish reason: {reason}); "
            'an instruction-tuned model may expect a chat prompt: try `ortgen chat "..."`',
            file=sys.stderr,
        )
    return 0
