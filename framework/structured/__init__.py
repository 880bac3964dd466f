"""Structured output: the constraint settings (``settings``), OpenAI's ``response_format``
and parsing JSON answers (``response_format``), checking a constraint compiles without a
model (``check``), and tool calls (``tool_calls``)."""
