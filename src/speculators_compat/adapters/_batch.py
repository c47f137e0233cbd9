"""What ``generate()`` accepts as a batch, checked before speculators adds any request.

Why: speculators' ``generate()`` takes ``list[list[int]] | torch.Tensor`` and checks
nothing else. A single sequence (``[5, 6, 7]``), a 1-D tensor or a dict fails with
``TypeError: object of type 'int' has no len()``; ``None`` inside a sequence with a
``'<' not supported`` from deep inside; a numpy array with numpy's "truth value is
ambiguous"; sequences that are tuples with an ``AttributeError`` in vLLM after some
requests were added. A sequence longer than ``max_model_len - 1`` is cut there
silently, so its hidden states cover only its beginning.
How: :func:`check_batch` accepts exactly what upstream handles correctly (an outer list
or tuple of sequences, each a list of ints or a 1-D integer tensor, or a 2-D integer
tensor) and raises ``CompatError`` naming the input's type and what is expected for
anything else; it returns the sequences' lengths for :func:`truncation`. The per-token
work runs in C (``set(map(type, seq))``, ``min``/``max``, tensor reductions): the
pure-Python search for the offending position runs only once a check has failed.
"""

from __future__ import annotations

import numbers

from .._errors import CompatError

EXPECTED = ("a batch of token-id sequences: a list of lists of ints (e.g. [[1, 2, 3], [4, 5]]) "
            "or a 2-D integer torch.Tensor")


def _type(obj) -> str:
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _a(obj) -> str:
    name = _type(obj)
    return ("an " if name[0] in "aeiou" else "a ") + name


def _refuse(what: str) -> CompatError:
    return CompatError(f"speculators-compat: generate() got {what}; it expects {EXPECTED} "
                       "(nothing was run).")


def _torch_tensor(obj) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch():
    import sys

    return sys.modules.get("torch")  # a tensor can exist only once torch is imported


def _check_tensor(tensor, where: str, ndim: int, vocab_size: int | None) -> None:
    torch = _torch()
    if tensor.dim() != ndim:
        raise _refuse(f"{where} with {tensor.dim()} dimension(s) (shape {tuple(tensor.shape)}), "
                      f"not {ndim}")
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise _refuse(f"{where} of dtype {tensor.dtype}; token ids must be integers")
    if tensor.numel() == 0:
        raise CompatError(f"speculators-compat: generate() got {where} with no tokens "
                          f"(shape {tuple(tensor.shape)}); drop empty samples (nothing was run).")
    if vocab_size is not None:
        outside = (tensor < 0) | (tensor >= vocab_size)
        if bool(outside.any()):
            at = torch.nonzero(outside)[0].tolist()
            seq, pos = (at[0], at[1]) if ndim == 2 else (None, at[0])
            value = int(tensor[tuple(at)])
            raise _outside(where if seq is None else f"sequence {seq}", value, pos, vocab_size)


def _outside(where: str, value: int, pos: int, vocab_size: int) -> CompatError:
    return CompatError(
        f"speculators-compat: {where} has token id {value} at position {pos}, outside the "
        f"model's vocabulary (0..{vocab_size - 1}); check the tokenizer matches the model "
        "(nothing was run).")


def _bad_type(t: type) -> bool:
    return not issubclass(t, numbers.Integral) or issubclass(t, bool)


def _check_list(seq: list, i: int, vocab_size: int | None) -> None:
    types = set(map(type, seq))
    if types != {int} and any(_bad_type(t) for t in types):
        pos, bad = next((p, t) for p, t in enumerate(seq) if _bad_type(type(t)))
        raise CompatError(f"speculators-compat: sequence {i} contains {bad!r} ({_type(bad)}) at "
                          f"position {pos}; token ids must be ints (nothing was run).")
    if vocab_size is not None and (min(seq) < 0 or max(seq) >= vocab_size):
        pos = next(p for p, t in enumerate(seq) if t < 0 or t >= vocab_size)
        raise _outside(f"sequence {i}", seq[pos], pos, vocab_size)


def check_batch(token_ids, vocab_size: int | None = None) -> list[int]:
    """Refuse input speculators would fail on (halfway or with an unclear error) or
    silently mis-embed; return the length of each sequence."""
    if _torch_tensor(token_ids):
        _check_tensor(token_ids, "a tensor", 2, vocab_size)
        return [int(token_ids.shape[1])] * int(token_ids.shape[0])
    if not isinstance(token_ids, (list, tuple)):
        hint = " (call .tolist() on it)" if hasattr(token_ids, "tolist") else ""
        raise _refuse(f"{_a(token_ids)}{hint}")
    if len(token_ids) == 0:
        raise CompatError("speculators-compat: generate() got an empty batch; pass a list of "
                          "token-id sequences.")
    lengths = []
    for i, seq in enumerate(token_ids):
        if isinstance(seq, list):
            if len(seq) == 0:
                raise CompatError(f"speculators-compat: sequence {i} of the batch is empty; "
                                  "drop empty samples before generate() (nothing was run).")
            _check_list(seq, i, vocab_size)
        elif _torch_tensor(seq):
            if seq.dim() == 1 and seq.numel() == 0:
                raise CompatError(f"speculators-compat: sequence {i} of the batch is empty; "
                                  "drop empty samples before generate() (nothing was run).")
            _check_tensor(seq, f"sequence {i}: a tensor", 1, vocab_size)
        elif isinstance(seq, numbers.Integral):
            raise _refuse(f"{_a(token_ids)} whose item {i} is {_a(seq)}, not a "
                          "sequence (for a single sequence pass [ids])")
        else:
            hint = (" (call .tolist() on it)" if hasattr(seq, "tolist") else
                    " (convert it: [list(s) for s in batch])" if isinstance(seq, tuple) else "")
            raise _refuse(f"{_a(token_ids)} whose sequence {i} is {_a(seq)}{hint}")
        lengths.append(len(seq))
    return lengths


def truncation(lengths: list[int], max_len: int) -> tuple[int, int, int]:
    """(sequences longer than ``max_len``, the most tokens one loses, tokens lost in all)."""
    cut = [n - max_len for n in lengths if n > max_len]
    return len(cut), max(cut, default=0), sum(cut)
