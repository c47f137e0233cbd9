"""Contract suite: every adapter against the real installed vLLM and speculators."""
