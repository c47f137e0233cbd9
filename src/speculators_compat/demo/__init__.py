"""Demo helpers: tiny locally-built checkpoints and a transformers reference for hidden states.

The submodules import torch/transformers at module level, so they are only imported on demand;
the top-level ``speculators_compat`` package never imports this package.
"""
