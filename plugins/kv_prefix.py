"""Placeholder: filled in by the cache-backends work (issue 8)."""
