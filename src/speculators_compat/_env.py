"""Environment variables the shim reads or sets (one place, so docs and code agree)."""

#: Set by ``activate()`` in its own process; spawned vLLM processes inherit it and the
#: ``vllm.general_plugins`` entry point re-activates there only when it is present.
ACTIVE = "SPECULATORS_COMPAT_ACTIVE"
#: Comma-separated adapter names, or kinds (``safeguard``, ``platform``,
#: ``upstream-change``), to leave alone (status ``disabled``).
DISABLE = "SPECULATORS_COMPAT_DISABLE"
#: ``1``/``true``: a ``mismatch`` or ``failed`` adapter raises instead of warning.
#: ``activate(strict=...)`` sets it for the processes started from then on.
STRICT = "SPECULATORS_COMPAT_STRICT"
#: Comma-separated adapter names: activate only these (the others are ``disabled``).
#: ``activate(only=...)`` sets it, so that vLLM's workers honour the same selection.
ONLY = "SPECULATORS_COMPAT_ONLY"
#: Version to assume for vLLM when the installed distribution's metadata is wrong or
#: missing (source builds, ``pip install -e``). Probes still decide what applies.
VLLM_VERSION = "SPECULATORS_COMPAT_VLLM_VERSION"
#: ``1``: run vLLM's batch-invariant kernels (``_batch_invariant``), refused where the
#: installed vLLM or the platform has none.
BATCH_INVARIANT = "SPECULATORS_COMPAT_BATCH_INVARIANT"
#: Path of a JSON file the report is written to after activation (provenance).
REPORT_FILE = "SPECULATORS_COMPAT_REPORT_FILE"
#: Set by ``run --data-parallel`` in the processes it starts (``_offline_hooks``): JSON,
#: what the replica generates.
DATA_PARALLEL = "SPECULATORS_COMPAT_DATA_PARALLEL"
#: Seconds between ``run --data-parallel``'s progress lines (default 30).
DATA_PARALLEL_PROGRESS_S = "SPECULATORS_COMPAT_DP_PROGRESS_S"

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def flag(value: str | None) -> bool:
    return (value or "").strip().lower() in TRUE_VALUES


def names(value: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in (value or "").split(",") if n.strip())
