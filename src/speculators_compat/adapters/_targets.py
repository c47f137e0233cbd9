"""Where adapters act: the names of the consumer modules and the declared-target form.

Adapters patch names inside speculators' generator module, because that module
imported vLLM's symbols by name (``from vllm... import Scheduler``): rebinding
them there changes what speculators sees and nothing that vLLM's own engine uses.
Declared targets (``Adapter.targets``) are written ``"module.path:Qualified.name"``.
Also here: the names adapters add there that another adapter calls (:data:`ABORT_ALL`).
"""

from __future__ import annotations

from .._speculators import (  # noqa: F401 - the adapters' names for them
    CONFIG_MODULE,
    CONTRACT_BY_REQUEST,
    CONTRACT_LIST,
    GENERATOR_MODULE,
    WORKER_EXTENSION,
    WORKER_MODULE,
)


def in_generator(*names: str) -> tuple[str, ...]:
    """Declared targets (``Adapter.targets``) for names in speculators' generator module."""
    return tuple(f"{GENERATOR_MODULE}:{n}" for n in names)


#: What ``_refusal.refuse_generator`` wraps when a fail-closed adapter refuses.
REFUSAL_TARGETS = in_generator("VllmHiddenStatesGenerator.__init__",
                               "VllmHiddenStatesGenerator.generate")

#: Method of the ``Scheduler`` rebound by ``scheduler_prefill_only`` that aborts every
#: request at once, deferred ones included (``generate_guard``'s cleanup calls it).
ABORT_ALL = "_compat_abort_all"
