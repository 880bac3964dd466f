"""Hugging Face's token rules: sequence bias, minimum length, suppressed and forced tokens,
the exponential length penalty, invalid-value removal and renormalisation."""
