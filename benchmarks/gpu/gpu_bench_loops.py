"""The loops users run around a hidden-state extractor, timed one pass at a time.

Used by ``gpu_bench.py``'s children for every path: (a) has no results, (b) returns
speculators' result dicts, (c) the native path's loaded tensors. Each loop is named after
what its users do with the results:

``offline``
    speculators' own ``scripts/data_generation_offline.py`` (0.4.0.1): ``results =
    gen.generate(batch)`` stays bound until the next call returns, and every sample is
    handed to a 4-thread pool that writes it with ``torch.save`` (one ``.pt`` file per
    sample, ``{"input_ids", "hidden_states": [h.contiguous() ...], "loss_mask"}``) to
    local disk while the next call runs. So the previous call's results, and those still
    queued for saving, are alive during every call.
``held``
    every result of the pass held in memory (a dataset collected in memory).
``dropped``
    each call's results consumed, then deleted before the next call.

Why passes look the way they do:

- One untimed lead-in call starts each ``offline`` and ``held`` pass, so that the first
  timed call already has earlier results alive, as every call but the first of a long
  run does.
- ``held`` and ``dropped`` touch every byte of each call's results (a checksum, timed
  apart as ``consume_s``), as a consumer would: results the driver never reads would
  leave shared pages out of its RSS. ``offline`` is consumed by its save pool.
- A pass's time is its calls (plus, for ``offline``, handing each call's samples to the
  pool); ``offline`` also records ``drain_s``, the wait for the last saves after the last
  call (a long run pays it once), and the pass is flagged when that wait exceeds a call
  (the saves would then bound the loop).
- Results must stay valid after later calls: the first two calls' results are
  checksummed when they return and again at the end of the pass (``held``), or in the
  files written from them (``offline``).
- Driver memory per pass: once the process's RSS has stopped falling (:func:`settle`),
  the kernel's peak RSS is reset before the pass (``/proc/self/clear_refs``) and read at
  its end, before the results are released.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from time import monotonic as _monotonic  # settle(): real time, whatever ``time`` is
from time import sleep as _sleep

LOOPS = ("offline", "held", "dropped")
#: speculators' offline script: ``MAX_IO_WORKERS = 4``.
SAVE_THREADS = 4
#: Calls whose results are checked for validity at the end of a pass.
CHECKED_CALLS = 2


# ------------------------------------------------------------------------------- memory
def rss() -> dict:
    """This process's memory from ``/proc/self/status`` (KiB): current, peak and the
    anonymous / file / shared-memory parts of the current RSS."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key.lower() + "_kib"] = int(val.split()[0])
    except (OSError, ValueError):
        pass
    return out


def reset_peak() -> bool:
    """Reset the kernel's peak RSS (VmHWM) to the current RSS; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def trim() -> None:
    """Collect garbage and hand freed heap back to the kernel (glibc ``malloc_trim``), so
    that one pass's released results do not count in the next pass's RSS."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def settle(timeout: float = 10.0, interval: float = 0.05, tol_kib: int = 4096,
           calm: int = 3) -> float:
    """Wait until this process's RSS stops falling; the seconds waited.

    Why: memory released by one pass may leave the process a little later than its last
    reference (the shim unmaps a call's region on a background thread). A peak measured
    from a reset taken meanwhile counts the previous pass's memory: the H200 run of
    2026-12-04 reset (b)'s peak at 2.1 GiB with 1.7 GiB of the previous pass's regions
    still mapped at the pass's start, while its calls then ran at 1.4 GiB. The pass
    starts once ``calm`` reads in a row, ``interval`` apart, fell by less than
    ``tol_kib``."""
    t0 = _monotonic()
    last = rss().get("vmrss_kib")
    if last is None:
        return 0.0
    quiet = 0
    while quiet < calm and _monotonic() - t0 < timeout:
        _sleep(interval)
        now = rss().get("vmrss_kib", last)
        quiet = quiet + 1 if last - now < tol_kib else 0
        last = now
    return _monotonic() - t0


# ------------------------------------------------------------------------------ checksum
def _tensor_sum(t) -> int:
    import numpy as np
    import torch

    raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
    n8 = raw.size // 8 * 8
    return int(raw[:n8].view(np.uint64).sum(dtype=np.uint64)) + int(raw[n8:].sum())


def checksum(tensors, pool: ThreadPoolExecutor | None = None) -> int:
    """Touch every byte of ``tensors`` (as a user consuming them would): the wrapping sum
    of their raw bytes as 64-bit words (numpy: a few GB/s per thread, in ``pool``'s
    threads where given; torch's integer sums are ~30x slower). Equal data gives equal
    sums; changed data almost surely does not."""
    tensors = list(tensors)
    sums = pool.map(_tensor_sum, tensors) if pool is not None else map(_tensor_sum, tensors)
    return sum(sums) % 2**64


# ------------------------------------------------------------------------ driver counters
def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif isinstance(v, bool):
            out[key] = int(v)
        elif isinstance(v, (int, float, str)) or v is None:
            out[key] = v
    return out


def find_stats(*objects) -> dict | None:
    """The shim's counters hung on ``objects`` (its driver-side executor, or a worker),
    read without knowing their names: every attribute whose name contains ``compat`` and
    that is a ``dict`` named ``*stats*``, or has a ``stats`` dict (or a ``stats()`` method
    returning one). Nested dicts are flattened (``a.b``); a second source's keys that
    collide get its attribute name as prefix. ``None`` where nothing is found."""
    out: dict = {}
    for obj in objects:
        try:
            attrs = list(vars(obj).items())
        except TypeError:
            continue
        for name, val in attrs:
            if "compat" not in name:
                continue
            # an object's all_stats() (the transport's sender: its copier's counters too)
            # before its stats
            stats = val if isinstance(val, dict) and "stats" in name else (
                getattr(val, "all_stats", None) or getattr(val, "stats", None))
            if callable(stats):
                try:
                    stats = stats()
                except Exception:  # noqa: BLE001 - informational only
                    stats = None
            if not isinstance(stats, dict):
                continue
            flat = _flat(dict(stats))
            if any(k in out for k in flat):
                flat = {f"{name}.{k}": v for k, v in flat.items()}
            out.update(flat)
            segments = getattr(val, "segments", None)
            if segments is not None and "segments" not in out:
                try:
                    out["segments"] = len(segments)
                except TypeError:
                    pass
    return out or None


def stats_delta(before: dict | None, after: dict | None, nonzero: bool = False) -> dict | None:
    """``after - before`` for the numeric keys of both (``nonzero``: only keys that
    changed)."""
    if before is None or after is None:
        return None
    out = {}
    for k, v in after.items():
        old = before.get(k, 0)
        if isinstance(v, (int, float)) and isinstance(old, (int, float)):
            d = v - old
            if d or not nonzero:
                out[k] = d
    return out


# ---------------------------------------------------------------------------------- pass
class Extractor:
    """What a loop needs from one path: ``call(batch)`` returns the call's results (or
    ``None`` for (a)); ``tensors(batch, out)`` every tensor of them (checksummed);
    ``samples(batch, out, masks)`` one dict per sample as the offline script saves it;
    ``stats()`` the driver's transport counters (or ``None``)."""

    def call(self, batch):  # pragma: no cover - interface
        raise NotImplementedError

    def tensors(self, batch, out) -> list:
        return []

    def samples(self, batch, out, masks) -> list[dict]:
        return []

    def stats(self) -> dict | None:
        return None


def run_pass(ex: Extractor, loop: str | None, seqs: list[list[int]], size: int, *,
             lead_in: list[list[int]] | None = None, save_dir: Path | None = None,
             check_pool: ThreadPoolExecutor | None = None, keep=None, check=None) -> dict:
    """One timed pass over ``seqs`` in calls of ``size`` sequences, in ``loop`` (``None``:
    results ignored, (a)). ``check(batch, out)`` (optional) validates each call's results
    outside its time; ``keep(batch, out)`` (optional) is shown each timed held call's
    results before they are released (the check file). Returns the pass's record."""
    import torch

    if loop not in (None, *LOOPS):
        raise ValueError(f"unknown loop {loop!r}; expected one of {LOOPS}")
    batches = [seqs[i:i + size] for i in range(0, len(seqs), size)]
    masks = {id(s): torch.ones(len(s), dtype=torch.long) for s in seqs + (lead_in or [])}
    rec: dict = {"loop": loop, "batch": size, "calls_s": [], "calls_tokens": [],
                 "calls_at": [], "rss_after_call_kib": [], "driver_calls": []}
    trim()
    rec["settle_s"] = settle()
    rec["rss_start"] = rss()
    rec["peak_reset"] = reset_peak()
    pool = ThreadPoolExecutor(SAVE_THREADS) if loop == "offline" else None
    futures: list = []
    paths: list[Path] = []
    held: list = []
    sums: list[int] = []
    consume = submit = 0.0
    states = [0]  # bytes of the hidden states handed to the save pool (timed calls)
    out = None
    if loop == "offline":
        if save_dir is None:
            raise ValueError("the offline loop needs save_dir")
        save_dir.mkdir(parents=True, exist_ok=True)

    def hand_over(batch, res, first: bool) -> None:
        """What the loop does with a call's results (outside the call's time)."""
        nonlocal consume, submit
        if loop == "offline":
            t = time.perf_counter()
            for sample in ex.samples(batch, res, masks):
                path = save_dir / f"data_{len(paths)}.pt"
                paths.append(path)
                futures.append(pool.submit(torch.save, sample, path))
                if not first:
                    states[0] += _nbytes(sample["hidden_states"])
            if not first:
                submit += time.perf_counter() - t
        elif loop in ("held", "dropped"):
            t = time.perf_counter()
            s = checksum(ex.tensors(batch, res), check_pool)
            if not first:
                consume += time.perf_counter() - t
                if len(sums) < CHECKED_CALLS:
                    sums.append(s)
            if loop == "held":
                held.append((batch, res, not first))

    if lead_in and loop in ("offline", "held"):
        t = time.perf_counter()
        out = ex.call(lead_in)
        rec["lead_in"] = {"seqs": len(lead_in), "tokens": sum(map(len, lead_in)),
                          "seconds": time.perf_counter() - t}
        if check is not None:
            check(lead_in, out)
        hand_over(lead_in, out, first=True)
        lead_files = len(paths)
    else:
        lead_files = 0
    for batch in batches:
        before = ex.stats()
        at = time.time()
        t = time.perf_counter()
        out = ex.call(batch)  # the previous call's results stay bound until here
        dt = time.perf_counter() - t
        after = ex.stats()
        rec["calls_s"].append(dt)
        rec["calls_at"].append([at, at + dt])  # wall clock (bench_timeline's windows)
        rec["calls_tokens"].append(sum(map(len, batch)))
        rec["driver_calls"].append(stats_delta(before, after, nonzero=True))
        if check is not None:
            check(batch, out)
        if "dtype" not in rec:  # (no name bound to the tensors: they must not outlive out)
            rec["dtype"] = next((str(x.dtype) for x in ex.tensors(batch, out)), None)
        if loop == "offline" and len(sums) < CHECKED_CALLS:
            t = time.perf_counter()  # what the saved files must hold, read as returned
            sums.append(checksum(ex.tensors(batch, out), check_pool))
            consume += time.perf_counter() - t
        hand_over(batch, out, first=False)
        if loop == "dropped":
            del out
            out = None
        rec["rss_after_call_kib"].append(rss().get("vmrss_kib"))
    tokens = sum(rec["calls_tokens"])
    seconds = sum(rec["calls_s"]) + submit
    rec.update(calls=len(batches), seqs=len(seqs), tokens=tokens, seconds=seconds,
               tokens_per_s=tokens / seconds if seconds else None, submit_s=submit,
               consume_s=consume)
    if loop == "offline":
        t = time.perf_counter()
        wait(futures)
        rec["drain_s"] = time.perf_counter() - t
        rec["drain_exceeds_a_call"] = rec["drain_s"] > max(rec["calls_s"], default=0.0)
        errors = [repr(f.exception()) for f in futures if f.exception() is not None]
        pool.shutdown()
    rec["peak_rss"] = rss()  # before the results are released
    if loop == "held":
        timed = [(batch, res) for batch, res, is_timed in held if is_timed]
        if keep is not None:
            for batch, res in timed:
                keep(batch, res)
        rec["results_unchanged"] = all(checksum(ex.tensors(*timed[i]), check_pool) == s
                                       for i, s in enumerate(sums))
        del timed
    del out
    held.clear()
    if loop == "offline":
        rec["files"] = _check_files(paths[lead_files:], sums, len(seqs), size, errors,
                                    check_pool, states[0])
        rec["results_unchanged"] = rec["files"].get("checked_unchanged")
        for p in paths:
            p.unlink(missing_ok=True)
    futures.clear()
    trim()
    rec["rss_released"] = rss()
    return rec


def _nbytes(hidden) -> int:
    """Bytes of a sample's hidden states (a list of tensors or one tensor)."""
    ts = hidden if isinstance(hidden, (list, tuple)) else [hidden]
    return sum(t.nelement() * t.element_size() for t in ts)


#: A saved file may hold its states and a few kB of pickle (``FILE_OVERHEAD`` each); more
#: means a tensor was saved with a larger storage behind it (a view of memory shared with
#: other results), which upstream's separate copies never are.
MAX_FILE_OVER_STATES = 1.5
FILE_OVERHEAD = 16 * 1024


def _check_files(paths: list[Path], sums: list[int], n: int, size: int, errors: list,
                 pool, states_bytes: int = 0) -> dict:
    """The offline loop's files: one per sample, each loadable, no larger than the states
    they hold (``MAX_FILE_OVER_STATES``), and those of the first checked calls hold exactly
    what those calls returned."""
    import torch

    written = [p for p in paths if p.exists()]
    out = {"expected": n, "written": len(written), "errors": errors[:3],
           "saved_bytes": sum(p.stat().st_size for p in written), "states_bytes": states_bytes}
    if states_bytes:
        out["saved_over_states"] = out["saved_bytes"] / states_bytes
    unchanged = []
    for i, s in enumerate(sums):
        chunk = paths[i * size:(i + 1) * size]
        loaded = [torch.load(p, weights_only=True) for p in chunk]
        tensors = []
        for d in loaded:
            hs = d["hidden_states"]
            tensors += list(hs) if isinstance(hs, (list, tuple)) else [hs]
        unchanged.append(checksum(tensors, pool) == s)
    out["checked_calls"] = len(sums)
    out["checked_unchanged"] = all(unchanged) if unchanged else None
    out["ok"] = (out["written"] == n and not errors and out["checked_unchanged"] is not False
                 and out["saved_bytes"] <= MAX_FILE_OVER_STATES * states_bytes
                 + FILE_OVERHEAD * len(written))
    return out
