"""Placeholder while the thinking-budget processor is written (replaced in this change)."""
