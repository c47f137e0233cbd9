"""Refuse, clearly and at once, a speculators release without the in-process generator.

Why: speculators 0.5.0 replaced ``VllmHiddenStatesGenerator`` / ``custom_worker`` with a
client of vLLM's own ``extract_hidden_states`` feature; there is nothing for this shim
to adapt, and silently doing nothing would let a user believe their data went through
it.
How: a probe only (changes nothing): if speculators is installed but its
``data_generation.vllm_hidden_states_generator`` module is missing, ``activate()`` raises
:class:`~speculators_compat.UnsupportedError` naming the version and the way forward.
Applies when: never applies a patch; raises for speculators >= 0.5, for a vLLM older
than the speculators release was written for (its generator's vLLM imports fail), and
for a transformers without a module speculators imports (``modeling_attn_mask_utils``,
removed in transformers 5.21), with the pin to install instead.
Remove when: never (it is the shim's scope check).
"""

from __future__ import annotations

from .._adapter import Adapter, Context, Verdict
from .._errors import UnsupportedError
from .._patcher import Patcher
from .._report import Kind
from .._versions import in_range
from . import _probes, _targets


class SpeculatorsSupported(Adapter):
    name = "speculators_supported"
    kind = Kind.SCOPE
    summary = "refuse speculators releases without the in-process generator (0.5+)"
    upstream = ("speculators 0.5.0: in-process generator replaced by vLLM's native "
                "extract_hidden_states")
    vllm_range = None
    speculators_range = None
    remove_when = "never: scope check"
    targets = ()  # a probe only

    def probe(self, ctx: Context) -> Verdict:
        spec = ctx.versions.get("speculators")
        if spec is None:
            return Verdict.not_needed("speculators is not installed")
        try:
            missing = in_range(spec, ">=0.5.0.dev0") or _probes.generator_module(ctx) is None
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("transformers"):
                raise UnsupportedError(
                    f"speculators-compat: speculators {spec} imports {exc.name}, which "
                    f"transformers {ctx.versions.get('transformers')} no longer has (removed "
                    "in transformers 5.21; speculators 0.3/0.4 were written for 4.x). Install "
                    "transformers<5.21 (e.g. pip install 'transformers<5.21'); vLLM's own pin "
                    "allows it.") from exc
            if not (exc.name or "").startswith("vllm"):
                raise
            raise UnsupportedError(
                f"speculators-compat: speculators {spec}'s generator imports {exc.name}, "
                f"which vLLM {ctx.versions.get('vllm')} does not have (older than the vLLM "
                "this speculators release was written for; no adapter of this shim can "
                "supply it). Use a vLLM at least as new as speculators' own pin (0.4.x: "
                "vllm>=0.12), or speculators 0.3.0 on vLLM 0.11.") from exc
        if missing:
            raise UnsupportedError(
                f"speculators-compat: speculators {spec} has no in-process hidden-state "
                f"generator ({_targets.GENERATOR_MODULE}); this shim only serves speculators "
                "0.3.x/0.4.x. With speculators >= 0.5 use its own data generation, which "
                "drives vLLM's native extract_hidden_states (vLLM >= 0.17) and needs no shim; "
                "or pin speculators<0.5 to keep the 0.3/0.4 pipeline.")
        return Verdict.not_needed(f"speculators {spec} has the in-process generator")

    def apply(self, patcher: Patcher, ctx: Context) -> None:  # pragma: no cover - never
        raise AssertionError("speculators_supported never applies")
