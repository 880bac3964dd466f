"""Placeholder while the llama3 format is written (replaced in this change)."""

from __future__ import annotations


class Llama3JsonFormat:
    def recognizes(self, probe: object) -> bool:
        return False

    def prompt_messages(self, messages, spec, *, template_renders_tools):
        raise NotImplementedError

    def answer_grammar(self, spec):
        raise NotImplementedError

    def parse(self, text, *, final):
        raise NotImplementedError
