"""PyTorch stand-in for the two FlashInfer norm kernels vLLM 0.34's Qwen3.5 imports (README.md)."""
