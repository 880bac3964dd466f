"""``ortgen serve``: an OpenAI-compatible HTTP server over one model (see docs/server.md)."""
