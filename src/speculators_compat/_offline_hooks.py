"""What ``speculators-compat run`` changes in the process of speculators 0.3/0.4's
unchanged offline script (``scripts/data_generation_offline.py``): whole files, and the
sample range a data-parallel replica generates.

Why: the script saves each sample with ``torch.save(data_dict, output_path)`` inside
``save_sample_to_disk`` (a thread pool of 4), in place: a run killed mid-write leaves a
truncated ``data_<i>.pt`` that its own resume (``find_last_checkpoint``: highest index
+ 1) keeps. And it has no way to generate the samples ``[a, b)`` alone: ``--max-samples``
bounds the raw conversations (preprocessing may drop some, so raw and file indices
differ), ``--start-idx`` only renames files.

Where it hooks in (where the script looks things up, nothing of the script changes):

* ``torch.save``, looked up on the ``torch`` module at every call of
  ``save_sample_to_disk``: :func:`install_atomic_save` makes a save to a path named
  ``data_<i>.pt`` (any path, in a data-parallel replica's processes) write a temporary
  in the same folder (:func:`temporary_name`) and ``os.replace`` it onto the name,
  so a file that exists is whole (a killed process leaves at most a
  ``data_<i>.tmp<hex>``, which training skips: it reads files ending in ``pt``).
* ``speculators.data_generation.preprocessing.load_and_preprocess_dataset``, which the
  script imports by name at module level (so it is patched before the script runs): in a
  replica (:data:`ENV`, set by :mod:`speculators_compat._data_parallel`) the dataset it
  returns is cut after the replica's last sample, and the replica's ``--output-dir`` is a
  scratch folder holding an empty ``data_<a-1>.pt``, so the script's own resume starts at
  ``a`` and stops at ``b``. Its ``data_<i>.pt`` saves go to the real output folder (whole,
  as above), and each save appends ``<i> <tokens>`` to the replica's log (progress, and
  the lengths a killed replica never wrote to ``sample_lengths.json``). In count mode the
  script stops after preprocessing, having written the number of samples.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from . import _env

#: Set by the data-parallel launcher in the processes it starts: a JSON object, see
#: :func:`replica_config`.
ENV = _env.DATA_PARALLEL
DATA_NAME = re.compile(r"^data_(\d+)\.pt$")
#: What a save killed before its rename leaves of ``data_<i>.pt`` (:func:`temporary_name`).
TEMPORARY = re.compile(r"^data_(\d+)\.tmp[0-9a-f]{12}$")
_lock = threading.Lock()


class ReplicaError(RuntimeError):
    """The script's dataset is not the one the launcher planned with."""


def replica_config(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The replica settings of this process, or ``None`` outside data-parallel runs.

    Keys: ``mode`` (``"count"`` or ``"range"``); count: ``count_file``; range: ``out``
    (the real output folder), ``scratch`` (the script's ``--output-dir``), ``stop`` (the
    number of samples the dataset is cut to), ``samples`` (the number it must have),
    ``log`` (the saved-samples log)."""
    text = (environ if environ is not None else os.environ).get(ENV)
    if not text:
        return None
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ReplicaError(f"{ENV} is not JSON ({exc}): it is set by speculators-compat run "
                           "--data-parallel for its replicas; unset it") from exc
    if not isinstance(cfg, dict) or cfg.get("mode") not in ("count", "range"):
        raise ReplicaError(f"{ENV}={text!r} names no mode: unset it")
    return cfg


def _same_dir(a: str, b: str) -> bool:
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def _tokens(obj: Any) -> int | None:
    ids = obj.get("input_ids") if isinstance(obj, dict) else None
    try:
        return len(ids) if ids is not None else None
    except TypeError:
        return None


def temporary_name(path: str) -> str:
    """``<folder>/<stem>.tmp<hex>`` for ``<folder>/<stem>.<ext>``.

    torch's file writer names the archive's records after the file name up to its last
    dot (``data_7/data.pkl`` for ``data_7.pt``): the temporary keeps that stem, so the
    renamed file is byte for byte what ``torch.save(obj, path)`` writes. The name ends in
    hex digits, never in ``pt``: training, which reads every file ending in ``pt`` below
    the folder, skips one a killed save left behind (:data:`TEMPORARY` matches it)."""
    folder, name = os.path.split(os.path.abspath(path))
    stem = name.rpartition(".")[0] or name
    return os.path.join(folder, f"{stem}.tmp{uuid.uuid4().hex[:12]}")


def save_whole(save: Callable[..., Any], obj: Any, path: str, *args: Any, **kwargs: Any) -> None:
    """``save(obj, <temporary in path's folder>)``, then ``os.replace`` onto ``path``."""
    tmp = temporary_name(path)
    # a new name (0o666 less the umask: the permissions torch.save's own open() gives);
    # saved by name, so torch writes it with its own file writer as it would ``path``
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        save(obj, tmp, *args, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _append(path: str, line: str) -> None:
    with _lock, open(path, "a", encoding="utf-8") as f:
        f.write(line)


def make_save(original: Callable[..., Any], cfg: dict[str, Any] | None) -> Callable[..., Any]:
    """``torch.save`` as the offline script needs it (see the module docstring)."""
    ranged = cfg is not None and cfg.get("mode") == "range"
    managed = cfg is not None

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return original(obj, f, *args, **kwargs)
        path = os.fspath(f)
        name = os.path.basename(path)
        match = DATA_NAME.match(name)
        if not match and not managed:
            return original(obj, f, *args, **kwargs)
        if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
            return original(obj, f, *args, **kwargs)
        if match and ranged and _same_dir(os.path.dirname(path) or ".", cfg["scratch"]):
            path = os.path.join(cfg["out"], name)
        save_whole(original, obj, path, *args, **kwargs)
        if match and ranged:
            _append(cfg["log"], f"{match.group(1)} {_tokens(obj)} {time.time():.3f}\n")
        return None

    save.__wrapped__ = original  # type: ignore[attr-defined]
    save.__doc__ = original.__doc__
    return save


def install_atomic_save(cfg: dict[str, Any] | None = None) -> None:
    """Wrap ``torch.save`` in this process (idempotent; nothing without torch)."""
    try:
        import torch
    except ImportError:
        return

    if getattr(torch.save, "__wrapped__", None) is not None:
        return
    torch.save = make_save(torch.save, cfg)


def make_load(original: Callable[..., Any], cfg: dict[str, Any]) -> Callable[..., Any]:
    """``load_and_preprocess_dataset`` for a replica (count mode: stop after it)."""

    def load_and_preprocess_dataset(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        dataset = result[0]
        n = len(dataset)
        if cfg["mode"] == "count":
            from ._files import write_text_atomic

            write_text_atomic(cfg["count_file"], json.dumps({"samples": n}) + "\n")
            raise SystemExit(0)
        if n != cfg["samples"]:
            raise ReplicaError(
                f"the script's dataset has {n} samples, the data-parallel plan {cfg['samples']}:"
                " the data or the options changed since the samples were counted; delete "
                f"{os.path.dirname(cfg['log'])} and run again")
        return (dataset.select(range(cfg["stop"])), *result[1:])

    load_and_preprocess_dataset.__wrapped__ = original  # type: ignore[attr-defined]
    return load_and_preprocess_dataset


def install_replica(cfg: dict[str, Any]) -> None:
    """Cut the dataset (or count it) where the script imports it from."""
    from speculators.data_generation import preprocessing

    if getattr(preprocessing.load_and_preprocess_dataset, "__wrapped__", None) is None:
        preprocessing.load_and_preprocess_dataset = make_load(
            preprocessing.load_and_preprocess_dataset, cfg)


def install() -> None:
    """What ``speculators-compat run`` installs before it runs the script."""
    cfg = replica_config()
    install_atomic_save(cfg)
    if cfg is not None:
        install_replica(cfg)
