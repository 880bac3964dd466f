"""``ortgen chat [MESSAGE]``: one answer, or an interactive conversation."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .args import add_generation_flags, add_model_flags, load_generator, settings_of
from .structured import add_structured_flags, warn_if_not_json


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with the model (one MESSAGE, or interactive)")
    p.add_argument("message", nargs="?", help="answer this one message and exit")
    p.add_argument("--system", help="system prompt")
    add_model_flags(p)
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_chat, one_shot=True)


def cmd_chat(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    gen = load_generator(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    session = gen.chat_session(system, **settings)
    if args.message is not None:
        return 130 if _answer(session, args.message) else 0
    print(
        "ortgen chat: type a message, an empty line or Ctrl-D to quit; Ctrl-C stops an answer.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        _answer(session, line)


def _answer(session: Any, message: str) -> bool:
    """Stream one answer; Ctrl-C stops it (True), and the partial answer stays in the
    history."""
    pieces = session.send(message)
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
    except KeyboardInterrupt:
        pieces.close()
        print("\n[interrupted]", file=sys.stderr)
        return True
    print()
    config = session.generator.resolve_config(session.settings).config
    warn_if_not_json(config, session.messages[-1]["content"], session.state.finish_reasons[0])
    return False
