"""OpenAI's presence and frequency penalties and logit bias."""
