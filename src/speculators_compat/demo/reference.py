"""Reference hidden states from plain transformers, and a tolerance check against them.

Why: to show that hidden states captured from vLLM (through speculators' generator, on old or new
vLLM) are the real per-layer outputs of the verifier, compare them with an independent forward pass
of the same checkpoint in transformers.  vLLM's CPU backend runs bf16, so the reference runs bf16
too.  The default tolerances are set from what correct runs achieve, with margin, and are far from
what wrong results give (measured 2026-12-01 on the CI envs, vLLM 0.16/0.32 x speculators
0.3.0/0.4.0.1, llama / qwen3_moe / deepseek_v3 checkpoints):

* minimum per-token cosine >= 0.998 (correct: >= 0.99993 for llama and qwen3_moe, 0.99913 to
  0.99916 for deepseek_v3's MLA layer 0; wrong: <= 0.91 for a neighbouring layer, swapped rows,
  rows one position late or a missing residual);
* relative L2 error ``||a - e|| / ||e||`` per layer <= 4 % (correct: <= 0.95 % for llama and
  qwen3_moe, 2.1 % for deepseek_v3's layer 0; wrong: >= 13 %);
* maximum absolute error <= 5 % of the reference's largest absolute value, an outlier guard
  (correct: <= 1.8 % on the CI envs, 2.7 % for deepseek_v3, 4.2 % on vLLM 0.12's CPU kernels in
  the support matrix).

``demo.runner.known_wrong_compares`` re-checks on every end-to-end run that the wrong kinds fail.
One test passes its own, looser tolerances: DeepSeek with ``llama_4_scaling``, where this module's
hook emulation of the scaling rounds differently from vLLM (correct: cosine 0.9904, relative L2
6.6 %; the reference without the scaling: cosine 0.9707).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["compare", "reference_hidden_states"]

DEFAULT_MIN_COSINE = 0.998
DEFAULT_MAX_REL_ABS_ERR = 0.05
DEFAULT_MAX_REL_L2_ERR = 0.04


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {dtype!r}")
    return value


def _transformers_config(model_path: str | os.PathLike[str]) -> Any:
    """The checkpoint's config in transformers' own class for its ``model_type``.

    ``import vllm`` registers vLLM's config classes with ``AutoConfig`` for some model types
    (``kimi_linear``, ...): in a process that built a generator, ``AutoConfig`` then returns
    vLLM's class, which transformers' modelling code cannot read (``'KimiLinearConfig' object
    has no attribute 'num_local_experts'``, transformers 5.20.2 beside vLLM 0.34).
    """
    import json

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    path = os.fspath(model_path)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    cls = getattr(transformers, CONFIG_MAPPING_NAMES.get(model_type, ""), None)
    if cls is None:
        return transformers.AutoConfig.from_pretrained(path)
    return cls.from_pretrained(path)


def _decoder_layers(model: torch.nn.Module) -> Any:
    """The language model's decoder layers of ``model``.

    ``AutoModelForCausalLM`` loads a multimodal wrapper's checkpoint as a text-only model for
    some families (Qwen3.5: ``Qwen3_5ForCausalLM`` from the ``text_config``; its layers are
    ``model.model.layers``) and as the wrapper itself for others (Gemma 4:
    ``Gemma4ForConditionalGeneration``, layers under ``model.model.language_model``).  A
    text-only forward of the wrapper runs only its language model (no image tokens, so the
    vision tower is never called), and vLLM's capture reads the same language model's layers
    (``find_base_model``: ``get_language_model()``), so these layers are the reference either way.
    """
    base = model.model
    inner = getattr(base, "language_model", None)
    return inner.layers if inner is not None and not hasattr(base, "layers") else base.layers


def reference_hidden_states(
    model_path: str | os.PathLike[str],
    sequences: Sequence[Sequence[int]],
    layer_ids: Sequence[int],
    dtype: str | torch.dtype = "bfloat16",
    *,
    apply_llama_4_scaling: bool = True,
    device: str = "cpu",
) -> list[list[torch.Tensor]]:
    """Outputs of decoder layers ``layer_ids`` for each token sequence, computed by transformers.

    The checkpoint is loaded with ``AutoModelForCausalLM`` in ``dtype`` on CPU.  Each sequence runs
    as its own forward pass (batch of one, no padding, positions 0..n-1), so nothing depends on
    padding or attention-mask handling.  A forward hook on the language model's ``layers[k]``
    (``model.model.layers``, or ``model.model.language_model.layers`` of a multimodal wrapper
    loaded as such: :func:`_decoder_layers`) records that layer's output (element 0 when the
    layer returns a tuple): the residual stream after layer k, what vLLM-side capture of
    "layer k" yields.  It equals transformers'
    ``output_hidden_states=True`` entry ``hidden_states[k + 1]`` except for the last layer, where
    transformers substitutes the final-norm output.

    Returns, per sequence, one tensor ``[len(sequence), hidden_size]`` (in ``dtype``, on CPU) per
    requested layer id, in the order of ``layer_ids`` (duplicates allowed).  Layer ids are
    0-based and must be within ``range(num_hidden_layers)``.

    DeepSeek-V3-family configs may set ``llama_4_scaling`` (``original_max_position_embeddings``,
    ``beta``), which transformers ignores but vLLM applies: every query vector at position p is
    multiplied by ``1 + beta * log(1 + floor(p / original_max_position_embeddings))`` after RoPE.
    Scaling commutes with the rotation, so a forward hook on each attention's ``q_b_proj`` (or
    ``q_proj``) reproduces it; ``apply_llama_4_scaling=False`` leaves it out (to show a test is
    sensitive to it).
    """
    import transformers

    torch_dtype = _as_dtype(dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.fspath(model_path), dtype=torch_dtype, config=_transformers_config(model_path),
        **({"device_map": device} if device != "cpu" else {}),
    )
    model = model.to(device).eval()
    layers = _decoder_layers(model)
    n_layers = len(layers)
    layer_ids = [int(k) for k in layer_ids]
    bad = [k for k in layer_ids if not 0 <= k < n_layers]
    if bad:
        raise ValueError(f"layer ids {bad} out of range for a model with {n_layers} layers")

    captured: dict[int, torch.Tensor] = {}

    def make_hook(k: int):
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            hs = output[0] if isinstance(output, (tuple, list)) else output
            captured[k] = hs.detach()

        return hook

    handles = [layers[k].register_forward_hook(make_hook(k)) for k in sorted(set(layer_ids))]
    scaling = getattr(model.config, "llama_4_scaling", None) if apply_llama_4_scaling else None
    if scaling:
        handles += _llama_4_scaling_hooks(model, scaling)
    results: list[list[torch.Tensor]] = []
    try:
        with torch.inference_mode():
            for seq in sequences:
                ids = [int(t) for t in seq]
                if not ids:
                    raise ValueError("empty sequence")
                captured.clear()
                model(input_ids=torch.tensor([ids], dtype=torch.long, device=device),
                      use_cache=False)
                per_layer = []
                for k in layer_ids:
                    hs = captured[k]
                    if hs.dim() == 3:  # [1, seq, hidden]
                        hs = hs[0]
                    per_layer.append(hs.to("cpu").clone())
                results.append(per_layer)
    finally:
        for h in handles:
            h.remove()
    return results


def _pair_stats(actual: Any, expected: Any) -> dict[str, Any]:
    a = torch.as_tensor(actual).detach().to("cpu", torch.float32)
    e = torch.as_tensor(expected).detach().to("cpu", torch.float32)
    stats: dict[str, Any] = {"shape_actual": list(a.shape), "shape_expected": list(e.shape)}
    if a.shape != e.shape:
        stats.update(ok=False, reason=f"shape mismatch: {list(a.shape)} vs {list(e.shape)}")
        return stats
    if a.numel() == 0:
        stats.update(ok=False, reason="empty tensors")
        return stats
    a2 = a.reshape(-1, a.shape[-1]) if a.dim() > 0 else a.reshape(1, 1)
    e2 = e.reshape(-1, e.shape[-1]) if e.dim() > 0 else e.reshape(1, 1)
    dot = (a2 * e2).sum(-1)
    na, ne = a2.norm(dim=-1), e2.norm(dim=-1)
    cos = dot / (na * ne)
    # Two all-zero tokens agree perfectly; one zero and one non-zero do not.
    cos = torch.where((na == 0) & (ne == 0), torch.ones_like(cos), cos)
    cos = torch.where((na == 0) ^ (ne == 0), torch.zeros_like(cos), cos)
    max_abs_err = float((a - e).abs().max())
    e_norm = float(e.norm())
    rel_l2 = float((a - e).norm()) / e_norm if e_norm > 0 else (0.0 if max_abs_err == 0
                                                                 else math.inf)
    ref_max_abs = float(e.abs().max())
    if ref_max_abs > 0:
        rel = max_abs_err / ref_max_abs
    else:
        rel = 0.0 if max_abs_err == 0 else math.inf
    stats.update(
        min_cosine=float(cos.min()),
        max_abs_err=max_abs_err,
        ref_max_abs=ref_max_abs,
        rel_max_abs_err=rel,
        rel_l2_err=rel_l2,
    )
    return stats


def compare(
    actual: Sequence[Sequence[torch.Tensor]],
    expected: Sequence[Sequence[torch.Tensor]],
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
    max_rel_abs_err: float = DEFAULT_MAX_REL_ABS_ERR,
    max_rel_l2_err: float = DEFAULT_MAX_REL_L2_ERR,
) -> dict[str, Any]:
    """Compare captured hidden states with reference ones, sequence by sequence, layer by layer.

    ``actual`` and ``expected`` are nested as ``[sequence][layer] -> tensor [tokens, hidden]`` (the
    shape :func:`reference_hidden_states` returns).  Everything is compared in float32.  For every
    pair it reports the minimum per-token cosine similarity, the maximum absolute error, the
    reference's maximum absolute value and their ratio, and the relative L2 error
    ``||actual - expected|| / ||expected||``.  A pair passes when the shapes match, all values are
    finite, ``min_cosine >= min_cosine``, ``rel_max_abs_err <= max_rel_abs_err`` and
    ``rel_l2_err <= max_rel_l2_err``.  Different numbers of sequences or of layers fail (nothing
    is silently left out by ``zip``).

    Returns ``{"ok", "reasons", "min_cosine", "max_rel_abs_err", "max_rel_l2_err", "per_layer",
    "thresholds", "per_sequence"}``: ``per_sequence[i][j]`` holds the stats of sequence i, layer
    position j (with ``ok`` and, on failure, ``reason``); the top-level values are the worst over
    all comparable pairs (None if there were none); ``per_layer[j]`` the worst of layer position
    j over all sequences; ``reasons`` lists every failure.
    """
    reasons: list[str] = []
    per_sequence: list[list[dict[str, Any]]] = []
    if len(actual) != len(expected):
        reasons.append(f"number of sequences differs: {len(actual)} vs {len(expected)}")
    values: list[tuple[int, float, float, float]] = []
    for i, (seq_a, seq_e) in enumerate(zip(actual, expected)):
        rows: list[dict[str, Any]] = []
        if len(seq_a) != len(seq_e):
            reasons.append(f"sequence {i}: number of layers differs: {len(seq_a)} vs {len(seq_e)}")
        for j, (a, e) in enumerate(zip(seq_a, seq_e)):
            st = _pair_stats(a, e)
            if "reason" not in st:
                cos, rel, l2 = st["min_cosine"], st["rel_max_abs_err"], st["rel_l2_err"]
                if not all(math.isfinite(v) for v in (cos, rel, l2)):
                    st.update(ok=False, reason=f"non-finite values (cosine {cos}, rel err {rel})")
                elif cos < min_cosine:
                    st.update(ok=False, reason=f"min cosine {cos:.6f} < {min_cosine}")
                elif rel > max_rel_abs_err:
                    st.update(
                        ok=False, reason=f"max abs err {rel:.4%} of ref max > {max_rel_abs_err:.2%}"
                    )
                elif l2 > max_rel_l2_err:
                    st.update(ok=False, reason=f"relative L2 error {l2:.4%} > {max_rel_l2_err:.2%}")
                else:
                    st["ok"] = True
                values.append((j, cos, rel, l2))
            if not st["ok"]:
                reasons.append(f"sequence {i}, layer position {j}: {st['reason']}")
            rows.append(st)
        per_sequence.append(rows)

    # NaN counts as the worst value so that it shows up in the summary.
    def lowest(xs):
        return min(xs, key=lambda c: -math.inf if math.isnan(c) else c, default=None)

    def highest(xs):
        return max(xs, key=lambda r: math.inf if math.isnan(r) else r, default=None)

    per_layer = [{"min_cosine": lowest([v[1] for v in values if v[0] == j]),
                  "max_rel_abs_err": highest([v[2] for v in values if v[0] == j]),
                  "max_rel_l2_err": highest([v[3] for v in values if v[0] == j])}
                 for j in sorted({v[0] for v in values})]
    return {
        "ok": not reasons,
        "reasons": reasons,
        "min_cosine": lowest([v[1] for v in values]),
        "max_rel_abs_err": highest([v[2] for v in values]),
        "max_rel_l2_err": highest([v[3] for v in values]),
        "per_layer": per_layer,
        "thresholds": {"min_cosine": min_cosine, "max_rel_abs_err": max_rel_abs_err,
                       "max_rel_l2_err": max_rel_l2_err},
        "per_sequence": per_sequence,
    }


def _llama_4_scaling_hooks(model: torch.nn.Module, scaling: dict[str, Any]) -> list[Any]:
    """Forward hooks that scale each attention's query projection per position, as vLLM does."""
    orig = float(scaling["original_max_position_embeddings"])
    beta = float(scaling["beta"])

    def hook(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(output.shape[-2], dtype=torch.float32, device=output.device)
        factor = 1 + beta * torch.log(1 + torch.floor(positions / orig))
        return (output.float() * factor[:, None]).to(output.dtype)

    handles = []
    for layer in _decoder_layers(model):
        attn = layer.self_attn
        proj = getattr(attn, "q_b_proj", None) or getattr(attn, "q_proj", None)
        if proj is None:
            raise ValueError("llama_4_scaling reference: attention has no q_b_proj/q_proj")
        handles.append(proj.register_forward_hook(hook))
    return handles
