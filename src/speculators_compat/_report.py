"""The report: what activation did in one process, per adapter (also ``doctor``'s table).

Provenance: the report is what users keep next to generated data (``save_report``),
what the CLI prints, and what vLLM's workers answer when asked (``worker_report``).
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _matrix_proof
from ._files import write_text_atomic


class Status(str, enum.Enum):
    """What happened to one adapter in one process."""

    APPLIED = "applied"
    NOT_NEEDED = "not-needed"
    MISMATCH = "mismatch"  # the installed API matches neither the old nor the known new shape
    FAILED = "failed"  # probe or apply raised; everything it changed was rolled back
    DISABLED = "disabled"  # switched off by name (env var or ``only=``)


class Kind(str, enum.Enum):
    """Why an adapter exists; says when it is expected to apply.

    Each kind's :attr:`description` is the one text for it (docs/adapters.md prints it;
    the report's summary line groups applied adapters by kind).
    """

    UPSTREAM_CHANGE = "upstream-change"
    PLATFORM = "platform"
    SAFEGUARD = "safeguard"
    SCOPE = "scope"
    PERFORMANCE = "performance"

    @property
    def description(self) -> str:
        """One sentence on when adapters of this kind act (docs/adapters.md prints it)."""
        return _KIND_DESCRIPTIONS[self]


_KIND_DESCRIPTIONS = {
    Kind.UPSTREAM_CHANGE: "follows a change in vLLM (or transformers) since the release "
                          "speculators pinned; none applies on that release (vLLM 0.11.0 for "
                          "speculators 0.3.0)",
    Kind.PLATFORM: "lets the pipeline run where upstream never ran it (vLLM's CPU platform, "
                   "no CUDA device); not needed on a GPU machine",
    Kind.SAFEGUARD: "guards against a data-loss or crash hazard in speculators' own code, on "
                    "every vLLM where the hazard exists; it changes upstream's result only "
                    "where upstream would lose or misorder data (batches above max_num_seqs, "
                    "chunked prompts, a failed call's leftovers, 0.4.x result order), fail, "
                    "or save a draft that vLLM serves on other layers than it learned from",
    Kind.SCOPE: "patches nothing: refuses what the shim cannot support",
    Kind.PERFORMANCE: "changes how captured data moves between processes, never what it is; "
                      "disable it to get upstream's path back",
}


@dataclass
class AdapterResult:
    """One line of the report."""

    name: str
    status: Status
    reason: str
    upstream: str
    summary: str
    phase: str
    vllm_range: str | None
    changes: list[str] = field(default_factory=list)
    kind: str = Kind.UPSTREAM_CHANGE.value

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


@dataclass
class Report:
    """What activation did in this process: per adapter, plus versions and pid."""

    results: list[AdapterResult]
    versions: dict[str, str | None]
    pid: int
    process: str
    strict: bool
    active: bool
    #: What this process generated, known only as it runs (``_layer_record``): under
    #: ``"hidden_states"`` one record per speculators generator (model, captured layers,
    #: the ids vLLM must feed a draft trained on them). Empty: no ``data`` key in the JSON.
    data: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> AdapterResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def by_status(self, status: Status) -> list[str]:
        return [r.name for r in self.results if r.status is status]

    @property
    def applied(self) -> list[str]:
        return self.by_status(Status.APPLIED)

    def applied_of(self, kind: Kind) -> list[str]:
        return [r.name for r in self.results
                if r.status is Status.APPLIED and r.kind == kind.value]

    @property
    def problems(self) -> list[AdapterResult]:
        return [r for r in self.results if r.status in (Status.MISMATCH, Status.FAILED)]

    def as_dict(self) -> dict[str, Any]:
        d = {
            "speculators_compat": self.versions.get("speculators_compat"),
            "active": self.active,
            "process": self.process,
            "pid": self.pid,
            "strict": self.strict,
            "versions": dict(self.versions),
            "proven": self.proven(),
            "adapters": [r.as_dict() for r in self.results],
        }
        if self.data:
            d["data"] = dict(self.data)
        return d

    def proven(self) -> dict[str, Any]:
        """What the support matrix proved for this vLLM and speculators (``_matrix_proof``)."""
        return _matrix_proof.verdict(self.versions.get("vllm"), self.versions.get("speculators"))

    def to_json(self, path: str | os.PathLike[str] | None = None, **kw: Any) -> str:
        """The report as JSON; also written to ``path`` if given (provenance beside data)."""
        text = json.dumps(self.as_dict(), indent=kw.pop("indent", 2), **kw)
        if path is not None:  # never half-written, even if the process dies meanwhile
            write_text_atomic(path, text + "\n")
        return text

    def summary_line(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        parts = ", ".join(f"{n} {s}" for s, n in counts.items())
        v = self.versions
        by_kind = "; ".join(f"{k.value}: {', '.join(names)}" for k in Kind
                            if (names := self.applied_of(k)))
        return (f"speculators-compat {v.get('speculators_compat')} active in {self.process} "
                f"pid {self.pid} (vllm {v.get('vllm')}, speculators {v.get('speculators')}; "
                f"{_matrix_proof.short(v.get('vllm'), v.get('speculators'))}): "
                f"{parts}; applied: {by_kind or 'none'}")

    def table(self, status_text: dict[Status, str] | None = None) -> list[str]:
        """One line per adapter: name, status, kind, reason (what ``str()`` and the
        CLI's ``doctor`` print; ``status_text`` renames statuses, e.g. for a dry run)."""
        status_text = status_text or {}
        width = max((len(r.name) for r in self.results), default=0)
        return [f"  {r.name:<{width}}  {status_text.get(r.status, r.status.value):<10}  "
                f"{r.kind:<15}  {r.reason}" for r in self.results]

    def __str__(self) -> str:
        return "\n".join([self.summary_line(), *self.table()])
