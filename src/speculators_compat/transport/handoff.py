"""speculators' ``clone()`` of a transported tensor takes the memory over instead of copying.

Why: speculators 0.3.x / 0.4.x copy every captured tensor they return
(``h.clone().cpu()``, or ``h[offset:offset + n].clone().cpu()`` in 0.3.x) so that their
results do not alias the worker's buffers. Through the transport those tensors already
are views of memory that belongs to their call alone (the call's region, mapped
privately by the driver: see :mod:`speculators_compat.transport.region`). At real sizes
that copy is most of what is left of the transport's cost: on an H200 with an 8B-shaped
model, 7.5 GB per pass of 229k tokens with four layers, written into freshly faulted
pages (0.85 s per pass on 8 threads, 1.4 s on 4).

How: the driver hands speculators instances of :class:`HandoffTensor` (a
``torch.Tensor`` subclass: the same values, shapes, dtype and device). Its ``clone()``
returns a plain ``torch.Tensor`` over exactly the bytes of the tensor (or slice) it was
called on, as its own storage (``torch.from_numpy`` of that byte range): what a clone
returns, minus the copy. The storage keeps the region mapped. Anything else on a
``HandoffTensor`` (slicing, ``len``, ``.shape``) behaves as on a plain tensor; a
``clone()`` that cannot take the memory over (not contiguous, a ``memory_format`` other
than the default, memory not registered here) is a real copy, also returned as a plain
tensor. Plain tensors never see any of this: only the tensors the transport returns are
of this class, and only speculators' own code holds them, for the length of one
``generate()`` call.

Visible differences from a copied clone, both harmless for speculators' pipeline: the
storage is not resizable (``resize_`` raises), and a result's pages belong to a memfd
mapped privately (they count as ``RssShmem`` until written; a write copies the page, as
after ``fork()``).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

#: Storage data pointer -> the uint8 array holding exactly that storage's bytes, for every
#: tensor the transport handed over (weak: an entry lives as long as its storage).
_BACKING: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_CLASS: Any = None


def handoff_class():
    """``HandoffTensor``, built on first use (torch is imported only when needed)."""
    global _CLASS
    if _CLASS is None:
        import torch

        clones = {torch.Tensor.clone, torch.clone}

        class HandoffTensor(torch.Tensor):
            """A transported tensor whose ``clone()`` takes the memory over (see module)."""

            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in clones and args and isinstance(args[0], cls):
                    taken = _take_over(args[0], args[1:], kwargs)
                    if taken is not None:
                        return taken
                    with torch._C.DisableTorchFunctionSubclass():
                        return func(*args, **kwargs)  # a real copy, as a plain tensor
                return super().__torch_function__(func, types, args, kwargs)

        _CLASS = HandoffTensor
    return _CLASS


def _take_over(t, extra: tuple, kwargs: dict):
    """A plain tensor over exactly ``t``'s bytes, or ``None`` where a copy is needed."""
    import torch

    with torch._C.DisableTorchFunctionSubclass():
        fmt = kwargs.get("memory_format", torch.preserve_format)
        if extra or set(kwargs) - {"memory_format"} or fmt not in (
                torch.preserve_format, torch.contiguous_format):
            return None
        storage = t.untyped_storage()
        backing = _BACKING.get(storage.data_ptr())
        if backing is None or not t.is_contiguous() or t.numel() == 0:
            return None
        start = t.data_ptr() - storage.data_ptr()
        nbytes = t.numel() * t.element_size()
        if start < 0 or start + nbytes > backing.nbytes:
            return None
        return torch.from_numpy(backing[start:start + nbytes]).view(t.dtype).view(t.shape)


def hand_over(region, dtype, shape):
    """A ``HandoffTensor`` of ``dtype``/``shape`` over the uint8 array ``region`` (exactly its
    bytes). ``region`` stays alive as long as the tensor or any clone of it."""
    import torch

    t = torch.from_numpy(region).view(dtype).view(shape)
    if region.nbytes:
        _BACKING[t.untyped_storage().data_ptr()] = region
    return t.as_subclass(handoff_class())


def plain(region, dtype, shape):
    """A plain tensor of ``dtype``/``shape`` over the uint8 array ``region``."""
    import torch

    return torch.from_numpy(region).view(dtype).view(shape)


def torch_dtype(name: str):
    """The torch dtype named ``name`` (``"torch.bfloat16"`` or ``"bfloat16"``)."""
    import torch

    return getattr(torch, name.removeprefix("torch."))


def nbytes(shape, dtype) -> int:
    """Bytes of a contiguous tensor of ``shape`` and ``dtype`` (a torch dtype or its name)."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
