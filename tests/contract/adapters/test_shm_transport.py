"""Contract of the ``shm_transport`` adapter,
on the installed vLLM and speculators.

Speculators' legacy call shape fails (or is wrong) bare where the upstream note says
so and works through the adapter. The checks every adapter shares (the probe agrees with
the expectation table, apply/revert restores identity and changes only the declared
targets) run for every adapter in tests/contract/test_every_adapter.py.
"""

from __future__ import annotations

import inspect

from ..expectations import V, applied_if
from ..support import (
    BY_NAME,
    _check_executor_shim,
    one,
)

NAME = "shm_transport"

#: Its expected status on the installed release, and why (read by ``expectations.py``).
EXPECTED = (
    # Follows hook_capture (the shim's extension answers its RPCs); this machine has
    # memfd_create and a readable /proc/<pid>/fd.
    lambda e: applied_if(e.vllm >= (V("0.11.1.dev0") if e.speculators_03
                                 else V("0.12.0.dev0"))),
    "vLLM pickles collective_rpc replies (CUDA tensors through torch.save)")


def test_legacy_call_shape(base, vllm_config):
    legacy_call_shape(base, base.gen, vllm_config, BY_NAME[NAME])


def legacy_call_shape(base, gen, cfg, adapter):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from speculators_compat.adapters.collective_rpc_unique_reply import returns_single_result
    from speculators_compat.adapters.shm_transport import (
        CAPTURED_STATES_RPC,
        RESET_CAPTURE_RPC,
    )
    from speculators_compat.transport import wire

    # The calls it answers, as speculators makes them.
    src = inspect.getsource(gen)
    assert f'"{CAPTURED_STATES_RPC}",\n            unique_reply_rank=0' in src
    assert f'self.executor.collective_rpc("{RESET_CAPTURE_RPC}")' in src
    assert wire.unavailable_reason() is None  # Linux CI: memfd + /proc/<pid>/fd
    single = returns_single_result(MultiprocExecutor)
    init = gen.VllmHiddenStatesGenerator.__init__
    with one(base, adapter) as applied:
        _check_executor_shim(gen, MultiprocExecutor, applied, NAME, {"collective_rpc"})
        if applied:
            # Later probes (collective_rpc_unique_reply) still read vLLM's signature and
            # docstring through the shim, and vLLM's own executor is unchanged.
            assert returns_single_result(gen.MultiprocExecutor) is single
            assert gen.VllmHiddenStatesGenerator.__init__ is not init
    assert gen.VllmHiddenStatesGenerator.__init__ is init


def test_zero_copy_follows_speculators_own_clone(base, monkeypatch):
    """Zero copy is on exactly where the installed ``generate()`` clones what it gets (the
    call ``HandoffTensor.clone`` answers), and off with the variable or without a clone."""
    import types

    from speculators_compat.adapters import shm_transport

    monkeypatch.delenv(shm_transport.ZERO_COPY_ENV, raising=False)
    src = inspect.getsource(base.gen.VllmHiddenStatesGenerator.generate)
    assert ".clone().cpu()" in src  # 0.3.x: h[o:o + n].clone().cpu(); 0.4.x: h.clone().cpu()
    assert shm_transport._zero_copy_off_reason(base.gen) is None
    monkeypatch.setenv(shm_transport.ZERO_COPY_ENV, "0")
    assert shm_transport._zero_copy_off_reason(base.gen) == "SPECULATORS_COMPAT_ZERO_COPY=0"
    monkeypatch.delenv(shm_transport.ZERO_COPY_ENV)

    class NoClone:  # known wrong: a generate() that would hand the tensors out uncloned
        def generate(self, states):
            return [h.cpu() for h in states]

    reason = shm_transport._zero_copy_off_reason(types.SimpleNamespace(
        VllmHiddenStatesGenerator=NoClone))
    assert reason is not None and "does not clone" in reason


def test_transport_copy_threads_default_and_bounds(monkeypatch):
    """The capturing worker's copies from staging into the region run on
    ``SPECULATORS_COMPAT_COPY_THREADS`` threads (default 4), never more than the CPUs and
    never fewer than one; the adapter names the same variable."""
    import os

    from speculators_compat.adapters import shm_transport
    from speculators_compat.transport import copies

    assert shm_transport.COPY_THREADS_ENV == copies.COPY_THREADS_ENV
    monkeypatch.delenv(copies.COPY_THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert copies.copy_threads() == copies.DEFAULT_THREADS == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert copies.copy_threads() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv(copies.COPY_THREADS_ENV, "16")
    assert copies.copy_threads() == 16
    monkeypatch.setenv(copies.COPY_THREADS_ENV, "0")
    assert copies.copy_threads() == 1
    monkeypatch.setenv(copies.COPY_THREADS_ENV, "many")
    assert copies.copy_threads() == copies.DEFAULT_THREADS
