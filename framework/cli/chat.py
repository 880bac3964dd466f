"""``ortgen chat [MESSAGE]``: one answer, or an interactive conversation.

The answer is read as ``gen.chat()`` reads it (``ChatSession.send_deltas``): a thinking
model's thought streams to stderr (a dim ``thinking:`` block on a terminal), the answer
to stdout, and tool calls (with ``--tools``) follow it on stdout, one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from ..errors import OrtgenError
from .args import add_generation_flags, add_model_flags, load_generator, settings_of
from .structured import add_structured_flags, warn_if_not_json

#: OpenAI's reasoning_effort values
EFFORTS = ("none", "minimal", "low", "medium", "high")
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with the model (one MESSAGE, or interactive)")
    p.add_argument("message", nargs="?", help="answer this one message and exit")
    p.add_argument("--system", help="system prompt")
    p.add_argument(
        "--tools",
        metavar="FILE",
        help="OpenAI function tools the model may call: a .json file or inline JSON (a "
        "list); each call is printed as one JSON line",
    )
    p.add_argument(
        "--reasoning-effort",
        choices=EFFORTS,
        help="for a template that reads it; none or minimal turn a Qwen3-style "
        "template's thinking off",
    )
    add_model_flags(p)
    add_generation_flags(p)
    add_structured_flags(p)
    p.set_defaults(func=cmd_chat, one_shot=True)


def cmd_chat(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    if args.reasoning_effort is not None:
        settings["reasoning_effort"] = args.reasoning_effort  # a chat option of the session
    tools = _tools(args.tools) if args.tools is not None else None
    gen = load_generator(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    session = gen.chat_session(system, tools=tools, **settings)
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


def _tools(value: str) -> list[Any]:
    text = value if value.lstrip().startswith("[") else _read(value)
    try:
        tools = json.loads(text)
    except ValueError as exc:
        raise OrtgenError(f"--tools {value:.60}: not JSON: {exc}") from None
    if not isinstance(tools, list):
        raise OrtgenError(f"--tools {value:.60}: a list of tools, got {type(tools).__name__}")
    return tools


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OrtgenError(f"--tools {path}: cannot read it: {exc}") from None


class _Printer:
    """Deltas to the terminal: the thought to stderr, the answer to stdout."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.color = err.isatty()
        self.thinking = False
        self.wrote = False  # answer text on stdout

    def delta(self, delta: dict[str, Any]) -> None:
        thought = delta.get("reasoning_content")
        if thought:
            if not self.thinking:
                self.out.flush()
                self.err.write(f"{_DIM if self.color else ''}thinking: ")
                self.thinking = True
            self.err.write(thought)
            self.err.flush()
        content = delta.get("content")
        if content:
            self.end_thought()
            self.out.write(content)
            self.out.flush()
            self.wrote = True

    def end_thought(self) -> None:
        if self.thinking:
            self.err.write(f"{_RESET if self.color else ''}\n")
            self.err.flush()
            self.thinking = False

    def end(self, calls: list[dict[str, Any]]) -> None:
        self.end_thought()
        if self.wrote or not calls:
            self.out.write("\n")
        for call in calls:
            self.out.write(json.dumps(call, ensure_ascii=False) + "\n")
        self.out.flush()


def _answer(session: Any, message: str) -> bool:
    """Stream one answer; Ctrl-C stops it (True), and the partial answer stays in the
    history."""
    deltas = session.send_deltas(message)
    printer = _Printer(sys.stdout, sys.stderr)
    try:
        for delta in deltas:
            printer.delta(delta)
    except KeyboardInterrupt:
        deltas.close()
        printer.end_thought()
        print("\n[interrupted]", file=sys.stderr)
        return True
    reply = session.messages[-1]
    printer.end(reply.get("tool_calls", []))
    config = session.generator.resolve_config(session.settings).config
    warn_if_not_json(config, reply["content"] or "", session.finish_reason)
    return False
