"""``gemma_rmsnorm`` / ``gemma_fused_add_rmsnorm`` with FlashInfer's semantics, in PyTorch.

Why: the GPU kit carries no FlashInfer and vLLM 0.34's Qwen3.5 norm imports these two
(see ../README.md). Arithmetic in float32 as FlashInfer's kernels do; Gemma's ``1 + weight``.
"""

from __future__ import annotations

import torch


def _normed(s: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = s.pow(2).mean(dim=-1, keepdim=True)
    return s * torch.rsqrt(var + eps) * (1.0 + weight.float())


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: torch.Tensor | None = None, enable_pdl: bool | None = None
                  ) -> torch.Tensor:
    y = _normed(input.float(), weight, eps).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor,
                            weight: torch.Tensor, eps: float = 1e-6,
                            enable_pdl: bool | None = None) -> None:
    s = input.float() + residual.float()
    residual.copy_(s.to(residual.dtype))
    input.copy_(_normed(s, weight, eps).to(input.dtype))
