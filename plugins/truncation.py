"""Hugging Face's entropy-based truncation warpers: epsilon and eta cutoff."""
