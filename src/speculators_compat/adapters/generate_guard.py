"""Validate ``generate()`` input up front, and never let a failed call leak into the next.

Why: speculators' ``generate()`` adds every sequence to the scheduler before it runs
anything. An empty sequence fails deep inside vLLM after earlier sequences of the batch
were added, an out-of-vocabulary token id becomes a zero embedding (TP > 1, silent) or
kills the workers (TP = 1 on a GPU), and any failure mid-call leaves requests (and
captured rows) behind that the next call would silently return as part of its own batch.
A generator outlives what it was built with: after ``deactivate()`` (or one built before
``activate()``) its scheduler, executor and workers no longer match the patched module.
Malformed input (a single sequence, a dict, a NumPy array, tuples) fails with a
``TypeError`` or ``AttributeError`` that names neither the input nor the fix; sequences
longer than ``max_model_len - 1`` are cut silently; a dead worker surfaces as
``RuntimeError: cancelled`` and then ``AssertionError`` on every later call.
How: wrap ``VllmHiddenStatesGenerator.generate`` (speculators' class, the consumer):
before it runs, reject a batch that is not what speculators handles (``_batch``: the
input's type and what is expected), an empty batch, empty sequences, non-integer tokens
and ids outside ``0..vocab_size-1`` with a message naming the sequence (and position);
log one warning per call for the sequences speculators will cut (``CompatError`` under
``SPECULATORS_COMPAT_STRICT=1``); refuse a generator whose vLLM worker process has
exited, naming it (``_liveness``: pid, exit code), in the call it kills and after; at the
first call of each generator, check that its scheduler and executor are the classes the
module binds now and ask its workers which extension class they run. If the call raises
an ``Exception``, abort every request left in its scheduler (deferred ones included),
check that the workers' replies are in step (a nonce echoed back) and reset their
capture, each RPC with a timeout; a cleanup that fails is logged and the generator
refuses further calls. On an interrupt (``KeyboardInterrupt`` or any other
``BaseException``) no RPC is issued: the generator is marked unusable and the interrupt
propagates at once. ``__init__`` is wrapped to remember the generators built while
active; ``deactivate()`` marks those still alive unusable (their ``generate()`` raises).
Applies when: speculators' in-process generator is installed.
Fails closed: when its probe finds an unknown shape or raises, building the generator
and ``generate()`` raise ``CompatError`` (opt out: ``SPECULATORS_COMPAT_DISABLE=generate_guard``).
Remove when: speculators < 0.5 support is dropped.
"""

from __future__ import annotations

import logging
import os
import uuid
import weakref
from types import ModuleType
from typing import Any

from .. import _env
from .._adapter import Context, Verdict
from .._errors import CompatError
from .._patcher import Patcher, _label, target_of
from .._report import Kind
from . import _batch, _liveness, _probes, _refusal, _targets, _worker_extensions, _wrappers
from ._base import GeneratorAdapter

logger = logging.getLogger("speculators_compat")

#: Seconds an RPC issued by the guard itself may wait for the workers.
RPC_TIMEOUT_S = 120.0

#: generator -> why it refuses every further call.
_UNUSABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

REBUILD = "Build a new VllmHiddenStatesGenerator (after speculators_compat.activate())."


def validate_batch(token_ids, vocab_size: int | None = None) -> list[int]:
    """Refuse input speculators would fail on halfway, or silently mis-embed (see
    ``_batch``); return the sequences' lengths."""
    return _batch.check_batch(token_ids, vocab_size)


def check_truncation(lengths: list[int], max_len: int | None, decode_tokens: int = 1) -> None:
    """Say (once per call) that speculators will cut sequences longer than ``max_len``;
    refuse the batch instead under ``SPECULATORS_COMPAT_STRICT=1``."""
    if max_len is None:
        return
    count, most, total = _batch.truncation(lengths, max_len)
    if not count:
        return
    what = (f"{count} of {len(lengths)} sequence(s) are longer than max_model_len - "
            f"{decode_tokens} = {max_len} tokens (the longest by {most} tokens, {total} tokens "
            "in all)")
    if _env.flag(os.environ.get(_env.STRICT)):
        raise CompatError(f"speculators-compat (strict): {what}; speculators would cut them "
                          f"there. Raise max_model_len or split the sequences (nothing was run; "
                          f"unset {_env.STRICT} to let them be cut).")
    logger.warning("speculators-compat: %s; speculators cuts them there, so their hidden "
                   "states cover only the first %d tokens. Raise max_model_len or split the "
                   "sequences (%s=1 refuses such a batch).", what, max_len, _env.STRICT)


def max_prompt_len(generator, decode_tokens: int) -> int | None:
    """The longest prompt speculators keeps (``max_model_len - MAX_DECODE_TOKENS``)."""
    config = getattr(generator, "vllm_config", None)
    limit = getattr(getattr(config, "model_config", None), "max_model_len", None)
    return None if limit is None else int(limit) - decode_tokens


def vocab_size(generator) -> int | None:
    """The model's vocabulary size from the generator's vLLM config (``None`` when the
    object has no config: not a generator speculators built)."""
    config = getattr(generator, "vllm_config", None)
    if config is None:
        return None
    return int(config.model_config.get_vocab_size())


def mark_unusable(generator, reason: str) -> None:
    """Make every further ``generate()`` of ``generator`` raise ``CompatError(reason)``,
    also after ``deactivate()`` (the instance attribute shadows the class method)."""

    def generate(*args: Any, **kwargs: Any):
        raise CompatError(reason)

    try:
        _UNUSABLE[generator] = reason
        vars(generator)["generate"] = generate
    except TypeError:  # not weak-referenceable / no __dict__: nothing else to mark
        pass


def _rpc(executor, method, *, args: tuple = ()):
    """``collective_rpc`` with the guard's timeout where the executor accepts one."""
    kwargs: dict[str, Any] = {"args": args}
    if "timeout" in (_probes.parameters(executor.collective_rpc) or {}):
        kwargs["timeout"] = RPC_TIMEOUT_S
    return executor.collective_rpc(method, **kwargs)


def echo(worker, nonce: str) -> str:
    """Runs in each worker: returns ``nonce``, so the driver can tell its reply from a
    stale one left in the executor's in-order response queue by an earlier call."""
    return nonce


def _cleanup(generator, counter_before: Any) -> None:
    """Remove every trace of a failed call; raise ``CompatError`` if anything is left."""
    scheduler = getattr(generator, "scheduler", None)
    if scheduler is not None:
        abort_all = getattr(scheduler, _targets.ABORT_ALL, None)
        if abort_all is not None:  # scheduler_prefill_only would defer unprefilled ones
            abort_all()
        elif scheduler.requests:
            from vllm.v1.request import RequestStatus

            scheduler.finish_requests(list(scheduler.requests), RequestStatus.FINISHED_ABORTED)
        left = {name: len(getattr(scheduler, name, ()) or ())
                for name in ("requests", "running", "waiting")}
        if any(left.values()):
            raise CompatError(f"speculators-compat: the scheduler still holds requests after "
                              f"aborting them all ({left}).")
    if isinstance(counter_before, int) and generator._request_counter == counter_before:
        generator._request_counter += 1  # the failed call's request ids are never reused
    executor = getattr(generator, "executor", None)
    if executor is not None:
        nonce = uuid.uuid4().hex
        replies = _rpc(executor, echo, args=(nonce,))
        if not (isinstance(replies, list) and replies and all(r == nonce for r in replies)):
            raise CompatError("speculators-compat: the workers' replies are out of step with "
                              "the driver (a reply of the failed call was still queued).")
        _rpc(executor, "_reset_capture")


def _check_instance(generator, gen: ModuleType, expected_extension: str) -> None:
    """Refuse a generator whose parts were not built by the module as patched now."""
    found = []
    for attr, name in (("scheduler", "Scheduler"), ("executor", "MultiprocExecutor")):
        part = getattr(generator, attr, None)
        if part is not None and type(part) is not getattr(gen, name):
            found.append(f"its {attr} is a {_label(type(part))}, not the "
                         f"{_label(getattr(gen, name))} bound now")
    executor = getattr(generator, "executor", None)
    if executor is not None:
        try:
            running = _worker_extensions.running_extensions(executor, RPC_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - refuse rather than guess
            found.append(f"its workers could not be asked which extension they run ({exc!r})")
        else:
            if not running or any(expected_extension not in names for names in running):
                found.append(f"its workers run {running}, not {expected_extension}")
    if found:
        raise CompatError(
            "speculators-compat: this generator was not built under the current activation "
            f"({'; '.join(found)}): it was built before speculators_compat.activate(), or "
            f"before a deactivate(), and would run half-patched. {REBUILD}")


def _refuse_if_dead(generator, failure: BaseException | None = None) -> None:
    """Raise ``CompatError`` naming the dead worker(s) when one of ``generator``'s vLLM
    worker processes has exited; the generator refuses every later call likewise."""
    dead = _liveness.dead_workers(getattr(generator, "executor", None))
    if not dead:
        return
    why = _liveness.describe(dead, REBUILD)
    mark_unusable(generator, why)
    raise CompatError(why) from failure


def _interrupted(exc: BaseException) -> str:
    return (f"speculators-compat: a generate() of this generator was interrupted "
            f"({type(exc).__name__}); its scheduler and workers may still hold that call's "
            f"requests and replies. {REBUILD}")


class GenerateGuard(GeneratorAdapter):
    name = "generate_guard"
    kind = Kind.SAFEGUARD
    fail_closed = True
    summary = ("reject bad generate() input up front; leave nothing behind after a failed "
               "or interrupted call; refuse half-patched generators")
    upstream = ("speculators 0.3/0.4: generate() adds requests before running; failures "
                "leave state that corrupts the next call")
    vllm_range = None
    remove_when = "speculators < 0.5 support is dropped"
    targets = _targets.in_generator("VllmHiddenStatesGenerator.__init__",
                                       "VllmHiddenStatesGenerator.generate")
    refusal_targets = _targets.REFUSAL_TARGETS

    def check(self, ctx: Context, gen: ModuleType) -> Verdict:
        if not hasattr(gen.VllmHiddenStatesGenerator, "generate"):
            return Verdict.mismatch("VllmHiddenStatesGenerator has no generate()")
        return Verdict.needed("validate input before requests are added; clean up on failure")

    def refuse(self, patcher: Patcher, ctx: Context, message: str) -> None:
        _refusal.refuse_generator(patcher, ctx, message)

    def patch(self, patcher: Patcher, ctx: Context, gen: ModuleType) -> None:
        cls = gen.VllmHiddenStatesGenerator
        expected = ctx.memo(_worker_extensions.WORKER_EXTENSION_KEY,
                            lambda: _targets.WORKER_EXTENSION)
        built: weakref.WeakSet = weakref.WeakSet()
        checked: weakref.WeakSet = weakref.WeakSet()

        def init(wrapped, instance, args, kwargs):
            out = wrapped(*args, **kwargs)
            built.add(instance)
            return out

        decode_tokens = int(getattr(gen, "MAX_DECODE_TOKENS", 1))

        def generate(wrapped, instance, args, kwargs):
            reason = _UNUSABLE.get(instance)
            if reason is not None:
                raise CompatError(reason)
            _refuse_if_dead(instance)
            token_ids = _wrappers.argument(args, kwargs, "token_ids", 0)
            lengths = validate_batch(token_ids, vocab_size(instance))
            check_truncation(lengths, max_prompt_len(instance, decode_tokens), decode_tokens)
            if instance not in checked:
                try:
                    _check_instance(instance, gen, expected)
                except CompatError as exc:
                    mark_unusable(instance, str(exc))
                    raise
                except BaseException as exc:
                    if not isinstance(exc, Exception):  # interrupted during the check's RPC
                        mark_unusable(instance, _interrupted(exc))
                    raise
                checked.add(instance)
            counter = getattr(instance, "_request_counter", None)
            try:
                return wrapped(*args, **kwargs)
            except Exception as exc:
                _refuse_if_dead(instance, exc)
                try:
                    _cleanup(instance, counter)
                except BaseException as failure:
                    _refuse_if_dead(instance, exc)
                    why = (f"speculators-compat: cleaning up after a failed generate() "
                           f"failed ({failure!r}); this generator's state is unknown. {REBUILD}")
                    mark_unusable(instance, why)
                    logger.warning("%s", why, exc_info=failure)
                    if hasattr(exc, "add_note"):
                        exc.add_note(why)
                    if not isinstance(failure, Exception):
                        raise
                raise
            except BaseException as exc:  # Ctrl+C & co.: no RPC, return at once
                mark_unusable(instance, _interrupted(exc))
                raise

        def mark_live_instances() -> None:
            for g in list(built):
                mark_unusable(g, (
                    "speculators-compat: this generator was built while speculators-compat "
                    "was active, and deactivate() has since removed the patches it relies on "
                    f"(it would return silently wrong results). {REBUILD}"))

        patcher.wrap(cls, "__init__", init)
        patcher.wrap(cls, "generate", generate)
        # Same label as the __init__ wrap: both change what __init__ leaves behind.
        patcher.on_revert(f"{_label(cls)}.__init__", mark_live_instances,
                          target_of(cls, "__init__"))
