"""Train an EAGLE-3 draft on generated hidden states with speculators' own code, then
save, reload and compare; writes JSON to ``--out``.

Runs under ``python -m speculators_compat run`` (tests/e2e/test_offline_script.py, on the
files the offline generator just wrote) and is imported by ``gpu_train.py``. Everything
is speculators' own, unchanged: ``Eagle3SpeculatorConfig`` / ``SpeculatorsConfig`` /
``VerifierConfig``, ``Eagle3DraftModel`` (its Llama layers call transformers' decoder
layer, rotary embedding and attention), ``speculators.train.data``
(``Eagle3SampleFileDataset``, ``create_collate_fn``), ``speculators.train.vocab_mapping``
and ``save_pretrained`` / ``from_pretrained``. Nothing here imports the shim.

The checks (each a field of the JSON; the test asserts them):
- a forward returns a finite loss, the backward reaches every trainable parameter, an
  optimizer step changes the weights. torch's FlexAttention has no backward on CPU (on
  either stack), so on CPU the training steps run the draft's attention through
  ``dense_flex_attention`` (the same mask, evaluated densely, through SDPA); the
  comparisons below run speculators' own ``simple_flex_attention``, and
  ``dense_vs_flex_max_abs`` says how far the two forwards are apart;
- reloading the saved directory the way speculators' trainer resumes (the config's
  ``from_pretrained``, the model built from it, ``load_safetensors_state_dict`` +
  ``load_state_dict``; ``Eagle3DraftModel.from_pretrained`` itself passes ``verifier=`` to
  ``__init__`` and fails on the pinned stack too) gives the same ``config.json`` content, the
  same config dict, bit-identical tensors (same names) and the same forward (draft
  tokens, loss) on the same batch;
- known-wrong controls, every run: the weight comparison must report a copy of the
  reloaded model with one element moved by one ulp, the forward comparison one with a
  row of ``fc.weight`` scaled by 1.5, the config comparison a ``config.json`` with one
  changed field.

Usage: train_draft.py --model DIR --data DIR --token-freq FILE --work DIR --out FILE
       [--steps 1] [--device cpu] [--max-len 256] [--draft-vocab-size 256]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from speculators import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.train.checkpointer import load_safetensors_state_dict
from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn, list_files
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
from torch.nn.attention.flex_attention import create_mask
from torch.utils.data import DataLoader
from transformers import AutoConfig, LlamaConfig
from transformers.modeling_utils import AttentionInterface

FLEX = "simple_flex_attention"  # speculators' registration (eagle3/attention.py)
DENSE = "dense_flex_attention"


def dense_flex_attention(module, query, key, value, attention_mask, scaling=None, **_kwargs):
    """speculators' flex attention with the BlockMask's ``mask_mod`` evaluated densely,
    through SDPA: differentiable on CPU."""
    mask = create_mask(attention_mask.mask_mod, None, None, query.shape[2], key.shape[2],
                       device=query.device)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(DENSE, dense_flex_attention)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="EAGLE-3 draft: train, save, reload, compare")
    p.add_argument("--model", required=True, help="verifier checkpoint directory")
    p.add_argument("--data", required=True, help="directory of generated data_<i>.pt files")
    p.add_argument("--token-freq", required=True, help="speculators' token frequency file")
    p.add_argument("--work", required=True, help="directory for the saved draft")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--draft-vocab-size", type=int, default=256)
    p.add_argument("--ttt-steps", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def draft_config(model: str, draft_vocab_size: int, ttt_steps: int) -> Eagle3SpeculatorConfig:
    """The draft's config as speculators' scripts/train.py builds it (one Llama layer)."""
    verifier = AutoConfig.from_pretrained(model)
    layer = LlamaConfig(
        vocab_size=verifier.vocab_size, hidden_size=verifier.hidden_size,
        intermediate_size=verifier.intermediate_size, num_hidden_layers=1,
        num_attention_heads=verifier.num_attention_heads,
        num_key_value_heads=verifier.num_key_value_heads, hidden_act=verifier.hidden_act,
        max_position_embeddings=verifier.max_position_embeddings,
        initializer_range=verifier.initializer_range, rms_norm_eps=verifier.rms_norm_eps,
        head_dim=getattr(verifier, "head_dim", None))
    layer._attn_implementation = FLEX
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=draft_vocab_size,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_config(verifier, name_or_path=model)))


def vocab_maps(token_freq: str, draft_vocab_size: int, vocab_size: int):
    freq = torch.load(token_freq, weights_only=False)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, vocab_size)
    return d2t, t2d


def loader(data: str, max_len: int, batch_files: int, shuffle: bool, seed: int) -> DataLoader:
    dataset = Eagle3SampleFileDataset(max_len=max_len, datapath=data)
    g = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_files, shuffle=shuffle, generator=g,
                      collate_fn=create_collate_fn(max_len))


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def set_attention(model, name: str) -> None:
    """Switch the draft's attention function (its layers share this config object)."""
    model.config.transformer_layer_config._attn_implementation = name
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = name


def forward(model, batch: dict, ttt_steps: int):
    draft_tokens, loss, _metrics = model(**batch, ttt_steps=ttt_steps)
    return draft_tokens, loss


def weights_diff(a: dict, b: dict) -> list[str]:
    """Names whose tensors differ (bit-wise, dtype, shape) or exist on one side only."""
    diffs = sorted(set(a) ^ set(b))
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.cpu(), y.cpu()):
            diffs.append(name)
    return diffs


def forward_diff(model_a, model_b, batch: dict, ttt_steps: int) -> list[str]:
    with torch.no_grad():
        tok_a, loss_a = forward(model_a, batch, ttt_steps)
        tok_b, loss_b = forward(model_b, batch, ttt_steps)
    if len(tok_a) != len(tok_b):
        return [f"{len(tok_a)} vs {len(tok_b)} draft steps"]
    reasons = []
    for i, (x, y) in enumerate(zip(tok_a, tok_b)):
        if not torch.equal(x, y):
            reasons.append(f"draft tokens of step {i} differ")
    if not torch.equal(loss_a, loss_b):
        reasons.append(f"loss {loss_a.item()!r} vs {loss_b.item()!r}")
    return reasons


def config_diff(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if k != "transformers_version" and a.get(k) != b.get(k)]


def corrupted_copy(model, name: str, scale: float | None):
    """The model with one weight changed (a known-wrong reload): its first element moved
    by one ulp (``scale=None``), or its first row scaled by ``scale``."""
    bad = Eagle3DraftModel(model.config, t2d=model.t2d.clone(), d2t=model.d2t.clone())
    bad.load_state_dict(model.state_dict())
    with torch.no_grad():
        p = dict(bad.named_parameters())[name]
        if scale is None:
            flat = p.view(-1)
            flat[0] = torch.nextafter(flat[0], flat[0] + 1)
        else:
            p[0] *= scale
    bad = bad.to(next(model.parameters()).device).eval()
    set_attention(bad, FLEX)
    return bad


def build(args) -> tuple[Eagle3DraftModel, dict]:
    torch.manual_seed(args.seed)
    config = draft_config(args.model, args.draft_vocab_size, args.ttt_steps)
    d2t, t2d = vocab_maps(args.token_freq, args.draft_vocab_size,
                          config.transformer_layer_config.vocab_size)
    model = Eagle3DraftModel(config, t2d=t2d, d2t=d2t)
    return model, {"d2t": d2t, "t2d": t2d}


def train_steps(model, args, device) -> dict:
    """``--steps`` optimizer steps (forward, backward, step) over the generated files."""
    model.train()
    if device.type == "cpu":
        set_attention(model, DENSE)
    params = [p for p in model.parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params, lr=args.lr)
    losses, grads_missing = [], set()
    data = loader(args.data, args.max_len, 2, True, args.seed)
    step = 0
    while step < args.steps:
        for batch in data:
            _tokens, loss = forward(model, to_device(batch, device), args.ttt_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step == 0:
                grads_missing = {n for n, p in model.named_parameters()
                                 if p.requires_grad and (p.grad is None
                                                         or not torch.isfinite(p.grad).all()
                                                         or not p.grad.abs().sum() > 0)}
            opt.step()
            losses.append(float(loss.item()))
            step += 1
            if step >= args.steps:
                break
    set_attention(model, FLEX)
    changed = [n for n, p in model.named_parameters()
               if p.requires_grad and not torch.equal(p.detach(), before[n])]
    return {"losses": losses, "params_without_grad": sorted(grads_missing),
            "trainable": sorted(before), "changed_by_step": sorted(changed)}


def round_trip(model, args, device) -> dict:
    """save_pretrained, from_pretrained, compare config, weights, forward (+ controls)."""
    model.eval()
    save_dir = Path(args.work) / "draft"
    model.save_pretrained(save_dir)
    saved_json = json.loads((save_dir / "config.json").read_text())
    config = Eagle3SpeculatorConfig.from_pretrained(save_dir)
    reloaded = Eagle3DraftModel(config, t2d=model.t2d.cpu().clone(), d2t=model.d2t.cpu().clone())
    missing, unexpected = reloaded.load_state_dict(
        load_safetensors_state_dict(save_dir / "model.safetensors", "cpu"), strict=False)
    reloaded = reloaded.to(device).eval()
    set_attention(reloaded, FLEX)  # not serialised (a private attribute), as in train.py
    resaved = Path(args.work) / "draft-resaved"
    reloaded.save_pretrained(resaved)
    resaved_json = json.loads((resaved / "config.json").read_text())
    batch = to_device(next(iter(loader(args.data, args.max_len, 2, False, args.seed))), device)
    saved_keys = set(model.state_dict())
    ignore = set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    result = {
        "config_class": type(reloaded.config).__name__,
        "missing_keys": sorted(missing),
        "unexpected_keys": sorted(unexpected),
        "config_json_diff": config_diff(saved_json, resaved_json),
        "config_dict_diff": config_diff(model.config.to_dict(), reloaded.config.to_dict()),
        "saved_speculators_model_type": saved_json.get("speculators_model_type"),
        # the target layers vLLM will feed the draft (None: vLLM's default ids)
        "saved_aux_layer_ids": saved_json.get("eagle_aux_hidden_state_layer_ids"),
        "reloaded_aux_layer_ids": config.eagle_aux_hidden_state_layer_ids,
        "weights_diff": weights_diff({k: v for k, v in model.state_dict().items()
                                      if k not in ignore},
                                     {k: v for k, v in reloaded.state_dict().items()
                                      if k not in ignore}),
        "weights_compared": len(saved_keys - ignore),
        "forward_diff": forward_diff(model, reloaded, batch, args.ttt_steps),
    }
    with torch.no_grad():
        set_attention(model, DENSE)
        _t, dense_loss = forward(model, batch, args.ttt_steps)
        set_attention(model, FLEX)
        _t, flex_loss = forward(model, batch, args.ttt_steps)
    result["dense_vs_flex_loss"] = [float(dense_loss), float(flex_loss)]
    # Known-wrong controls: the comparisons above must see these differences.
    result["control_weights_diff"] = weights_diff(
        reloaded.state_dict(), corrupted_copy(reloaded, "fc.weight", None).state_dict())
    result["control_forward_diff"] = forward_diff(
        reloaded, corrupted_copy(reloaded, "fc.weight", 1.5), batch, args.ttt_steps)
    wrong = dict(saved_json, draft_vocab_size=saved_json["draft_vocab_size"] + 1)
    result["control_config_diff"] = config_diff(saved_json, wrong)
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    files = list_files(args.data)
    model, _maps = build(args)
    model.to(device)
    result = {"files": len(files), "device": str(device)}
    result.update(train_steps(model, args, device))
    result["loss_finite"] = all(math.isfinite(x) for x in result["losses"])
    result.update(round_trip(model, args, device))
    result["seconds"] = round(time.perf_counter() - t0, 2)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
