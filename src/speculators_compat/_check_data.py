"""``speculators-compat check-data``: verify a finished output directory of speculators
0.3.x/0.4.x's offline data generation (``scripts/data_generation_offline.py``).

Why: a data run takes hours and writes one ``data_<i>.pt`` per sample through a thread
pool; a killed run, a full disk or a bad node leaves gaps, truncated files or NaN rows,
and speculators' training finds them only when it reaches them (or never: it estimates
lengths from file sizes when ``sample_lengths.json`` does not name a file, and reads every
file ending in ``pt`` below the directory as a sample). This checks the whole directory
before training with torch's loader, as training loads it (``torch.load(mmap=True,
weights_only=True)``, ``speculators/train/data.py``; see :func:`load`), in parallel
processes, and prints the commands that regenerate the bad indices with the offline
script's own options.

What the offline script writes (identical at v0.3.0 and v0.4.0.1 unless noted):

* ``data_{i}.pt``: ``torch.save({"input_ids": LongTensor[n], "hidden_states": [Tensor[n,
  H]] * len(layer_ids), "loss_mask": Tensor[n]})``, ``i`` = sample index + ``--start-idx``;
  the hidden states are a list, one tensor per captured layer, in the model's dtype.
* ``sample_lengths.json`` (0.4 only): ``{"<i>": n}``, written when the run ends.
* ``data_config.json``: ``DataGenerationConfig`` written when the run ends: the command
  line (``reproducibility.command``), ``hidden_states.layer_ids``, ``model.hidden_size``,
  ``data.num_samples``, and a ``format.schema`` whose hidden-state dtype is the constant
  ``list[torch.bfloat16]`` whatever the model's dtype (so it is compared, but a difference
  is a warning, not an error).
* Resume: the script restarts after the highest ``data_<i>.pt`` in ``--output-dir``
  (``find_last_checkpoint``), sample ``i - --start-idx``; ``--max-samples`` keeps the first
  samples of the seeded shuffle. The regeneration commands go through ``speculators-compat
  run --data-parallel 1 --indices A:B``, which uses both and cuts the dataset to the range
  (``--max-samples`` counts conversations before preprocessing drops any, so it alone
  could stop early).

The shim adds :data:`speculators_compat._draft_layers.LAYERS_FILE` (the captured layers);
its layer ids and ``data_config.json``'s must agree.

``--model``: :func:`model_check` regenerates a few sampled files through speculators'
``VllmHiddenStatesGenerator`` (imported only there, after ``activate()``) and compares
each layer with the file (minimum per-token cosine).

No torch at import: the parent process lists and decides, worker processes load
(:func:`_check_files`). Exit status: 0 healthy, 1 bad files or directory problems, 2 no
such directory or no data files.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import shlex
import textwrap
import time
import types
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _draft_layers as dl

OK, BAD, ERROR = 0, 1, 2
SAMPLE_LENGTHS_FILE = "sample_lengths.json"
DATA_NAME = re.compile(r"^data_(\d+)\.pt$")
#: What the offline script is called in speculators' repository (not in the wheel).
SCRIPT = "scripts/data_generation_offline.py"
#: Lines of bad files and regeneration ranges printed without ``--json``.
SHOW = 20
RENAME = "named "


# --------------------------------------------------------------------------------------
# One file (runs in the worker processes)
# --------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    """The exception's type and first sentence (torch's load errors go on for lines)."""
    text = str(exc).strip().splitlines()
    first = text[0].split(". ")[0][:200] if text else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


class _TensorsOnly(pickle.Unpickler):
    """The C unpickler with globals limited to what ``torch.save`` writes for plain CPU
    tensors (torch's own loader resolves storage types before asking): the restricted
    unpickler of the :mod:`pickle` documentation, a subset of ``weights_only``'s allowlist."""

    GLOBALS = frozenset({("torch._utils", "_rebuild_tensor_v2"),
                         ("collections", "OrderedDict")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not loaded here")


#: ``torch.load(pickle_module=...)``: :class:`_TensorsOnly` as a pickle module.
_TENSORS_ONLY = types.ModuleType("speculators_compat_tensors_only")
_TENSORS_ONLY.Unpickler = _TensorsOnly  # type: ignore[attr-defined]
_TENSORS_ONLY.load = pickle.load  # type: ignore[attr-defined]


def load(path: str) -> Any:
    """``torch.load(path, mmap=True)`` as speculators' training loads a sample
    (``weights_only=True``), twice as fast for the small files of a data directory.

    torch's ``weights_only`` unpickler is a Python loop over the pickle's opcodes: a 3.7 KB
    sample (4 layers) loads in 0.6 ms with it and in 0.32 ms with the C unpickler (torch
    2.13, one core, 2026-12-06). So torch's loader runs first with :class:`_TensorsOnly`
    (C unpickler, two globals allowed); a file it refuses or fails to load is loaded with
    ``weights_only=True``, whose verdict stands."""
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False,
                          pickle_module=_TENSORS_ONLY)
    except Exception:  # noqa: BLE001
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


def check_file(path: str) -> tuple[list[str], int | None, int | None, str | None, int | None]:
    """``(reasons, tokens, layers, dtype, hidden_size)`` of one ``data_<i>.pt``; the
    checks that need no other file (loads; input_ids 1-D; one 2-D hidden state per layer
    with as many rows as input_ids; one dtype; finite; loss_mask as long as input_ids)."""
    import torch

    try:
        obj = load(path)
    except Exception as exc:  # noqa: BLE001
        return [f"does not load: {_first_line(exc)}"], None, None, None, None
    if not isinstance(obj, dict):
        return [f"holds a {type(obj).__name__}, not a dict"], None, None, None, None
    reasons: list[str] = []
    ids = obj.get("input_ids")
    n = None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        reasons.append("input_ids is not a 1-D tensor")
    elif ids.is_floating_point():
        reasons.append(f"input_ids has dtype {ids.dtype}")
    else:
        n = int(ids.shape[0])
        if n == 0:
            reasons.append("input_ids is empty")
    hs = obj.get("hidden_states")
    if isinstance(hs, torch.Tensor) and hs.dim() == 3:
        layers = list(hs.unbind(0))  # stacked [layers, n, H]
    elif isinstance(hs, (list, tuple)) and all(isinstance(h, torch.Tensor) for h in hs):
        layers = list(hs)
    else:
        reasons.append("hidden_states is not a list of tensors (nor a [layers, n, H] tensor)")
        layers = []
    dtypes, sizes = set(), set()
    for k, h in enumerate(layers):
        if h.dim() != 2:
            reasons.append(f"hidden state {k} has shape {list(h.shape)}, not [tokens, hidden]")
            continue
        dtypes.add(str(h.dtype).replace("torch.", ""))
        sizes.add(int(h.shape[1]))
        if n is not None and h.shape[0] != n:
            reasons.append(f"hidden state {k} has {h.shape[0]} rows, input_ids {n}")
        if not h.is_floating_point():
            reasons.append(f"hidden state {k} has dtype {h.dtype}")
        elif not bool(torch.isfinite(h).all()):
            nan = int(torch.isnan(h).sum())
            reasons.append(f"hidden state {k} has {nan} NaN and {int(torch.isinf(h).sum())} "
                           "Inf values")
    if len(dtypes) > 1:
        reasons.append(f"hidden states of dtypes {sorted(dtypes)}")
    if len(sizes) > 1:
        reasons.append(f"hidden states of widths {sorted(sizes)}")
    mask = obj.get("loss_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 1:
        m = int(mask.shape[0])
    elif isinstance(mask, (list, tuple)):
        m = len(mask)
    else:
        m = None
        reasons.append("no loss_mask" if mask is None else "loss_mask is not 1-D")
    if m is not None and n is not None and m != n:
        reasons.append(f"loss_mask has {m} entries, input_ids {n}")
    return (reasons, n, len(layers) if layers else None,
            dtypes.pop() if len(dtypes) == 1 else None,
            sizes.pop() if len(sizes) == 1 else None)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _check_files(paths: Sequence[str]) -> list[tuple]:
    return [check_file(p) for p in paths]


def _run_checks(paths: list[str], jobs: int) -> list[tuple]:
    """:func:`check_file` of every path, in order, over ``jobs`` processes (chunks of
    files per task: one round trip per chunk, not per file)."""
    if jobs <= 1 or len(paths) < 64:
        _init_worker()
        return _check_files(paths)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    size = max(16, min(1024, math.ceil(len(paths) / (jobs * 8))))
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]
    # spawn: the parent may hold torch's threads (tests); children import torch once each
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker) as pool:
        out: list[tuple] = []
        for part in pool.map(_check_files, chunks):
            out.extend(part)
    return out


# --------------------------------------------------------------------------------------
# The directory (parent process)
# --------------------------------------------------------------------------------------


def _load_json(path: str) -> tuple[Any, str | None]:
    """``(document, None)``, ``(None, None)`` where there is no file, or ``(None, why)``."""
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, ValueError) as exc:
        return None, f"{os.path.basename(path)} does not parse: {_first_line(exc)}"


def _sample_lengths(doc: Any) -> tuple[dict[int, int] | None, str | None]:
    if doc is None:
        return None, None
    if not isinstance(doc, dict):
        return None, f"{SAMPLE_LENGTHS_FILE} is not an object"
    out = {}
    for k, v in doc.items():
        if not (isinstance(k, str) and k.isdigit() and isinstance(v, int)
                and not isinstance(v, bool)):
            return None, f"{SAMPLE_LENGTHS_FILE} has entry {k!r}: {v!r} (not \"<index>\": length)"
        out[int(k)] = v
    return out, None


def _get(doc: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def _recorded_dtype(config: Any) -> str | None:
    text = _get(config, "format", "schema", "hidden_states", "dtype")
    m = re.search(r"torch\.(\w+)", text) if isinstance(text, str) else None
    return m.group(1) if m else None


def _ranges(indices: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _compress(indices: Iterable[int], limit: int = 8) -> str:
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in _ranges(indices)]
    return ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if
                                       len(parts) > limit else "")


def _stray_files(directory: str, top_level: Iterable[str]) -> list[str]:
    """Files ending in ``pt`` that training would read as samples but that are no
    ``data_<i>.pt`` of ``directory`` (``speculators.train.data.list_files`` walks it)."""
    stray = [n for n in top_level if n.endswith("pt") and not DATA_NAME.match(n)]
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=True):
            for root, _dirs, files in os.walk(entry.path, followlinks=True):
                stray += [os.path.relpath(os.path.join(root, f), directory)
                          for f in files if f.endswith("pt")]
    return sorted(stray)


def check(directory: str, jobs: int | None = None) -> dict[str, Any]:
    """The verdict on ``directory`` as a dict (what ``--json`` prints)."""
    t0 = time.perf_counter()
    jobs = max(1, jobs or os.cpu_count() or 1)
    result: dict[str, Any] = {"dir": directory, "jobs": jobs, "files_checked": 0,
                              "bad_files": [], "problems": [], "warnings": []}
    if not os.path.isdir(directory):
        result.update(status="error", exit=ERROR, seconds=0.0,
                      message=f"{directory}: no such directory")
        return result
    names = [e.name for e in os.scandir(directory) if e.is_file()]
    by_index: dict[int, list[str]] = {}
    for name in names:
        m = DATA_NAME.match(name)
        if m:
            by_index.setdefault(int(m.group(1)), []).append(name)
    problems, warnings = result["problems"], result["warnings"]

    config, why = _load_json(os.path.join(directory, dl.DATA_CONFIG_FILE))
    if why:
        problems.append(why)
    elif config is None:
        warnings.append(f"no {dl.DATA_CONFIG_FILE}: the offline script writes it when the run "
                        "ends, so the run did not finish (or the directory is not its "
                        "output); layers and the regeneration command are not known from it")
    lengths_doc, why = _load_json(os.path.join(directory, SAMPLE_LENGTHS_FILE))
    lengths, why2 = _sample_lengths(lengths_doc)
    if why or why2:
        problems.append(why or why2)
    elif lengths is None:
        warnings.append(f"no {SAMPLE_LENGTHS_FILE} (speculators 0.4 writes it when the run "
                        "ends; 0.3.0 writes none): the number of samples is taken from the "
                        "files, and training estimates lengths from file sizes")

    # Which indices must exist
    known = set(by_index) | set(lengths or ())
    start_idx = _start_idx(config)
    num_samples = _get(config, "data", "num_samples")
    if lengths is None and isinstance(num_samples, int) and num_samples > 0:
        known.add(start_idx + num_samples - 1)
    if not known:
        result.update(status="error", exit=ERROR, seconds=round(time.perf_counter() - t0, 3),
                      message=f"{directory}: no data_<i>.pt files")
        return result
    count = max(known) + 1
    result["expected_files"] = count

    # Layer count, hidden size and dtype the files must have
    statements = dl.read_dir(directory)
    layer_sets = sorted({s.layer_ids for s in statements})
    layers: int | None = None
    if len(layer_sets) > 1:
        problems.append("the metadata disagree on the layers: " + "; ".join(
            f"{os.path.basename(s.source)}: {list(s.layer_ids)}" for s in statements))
    elif layer_sets:
        layers = len(layer_sets[0])
        result["layer_ids"] = list(layer_sets[0])
        result["layer_ids_from"] = sorted({os.path.basename(s.source) for s in statements})
    hidden = _get(config, "model", "hidden_size")
    hidden = hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None

    bad: dict[int | str, list[str]] = {}  # index (or a file name) -> reasons

    def flag(key: int | str, reason: str) -> None:
        bad.setdefault(key, []).append(reason)

    for i in range(count):
        if i not in by_index:
            flag(i, "missing")
    renames, extra = [], []
    for i, files in by_index.items():
        if len(files) > 1:
            extra += [n for n in files if n != f"data_{i}.pt"]
            flag(i, f"{len(files)} files for index {i}: {', '.join(sorted(files))} (keep "
                    f"one, named data_{i}.pt)")
        elif files[0] != f"data_{i}.pt":
            renames.append(f"mv {shlex.quote(os.path.join(directory, files[0]))} "
                           f"{shlex.quote(os.path.join(directory, f'data_{i}.pt'))}")
            flag(i, f"{RENAME}{files[0]}, not data_{i}.pt (training looks its length up "
                    f"in {SAMPLE_LENGTHS_FILE} by the text after the last '_')")
    stray = _stray_files(directory, names)
    if stray:
        problems.append(f"{len(stray)} other file(s) ending in 'pt' that speculators' "
                        f"training would read as samples (it reads every such file below "
                        f"the directory): {', '.join(stray[:5])}"
                        + (" ..." if len(stray) > 5 else ""))

    # Load every file
    order = sorted((i, name) for i, files in by_index.items() for name in files)
    checked = _run_checks([os.path.join(directory, name) for _, name in order], jobs)
    result["files_checked"] = len(order)
    loaded = [(i, name, *rest) for (i, name), rest in zip(order, checked)]
    layer_counts = Counter(r[4] for r in loaded if r[4])
    dtypes = Counter(r[5] for r in loaded if r[5])
    widths = Counter(r[6] for r in loaded if r[6])
    dtype = dtypes.most_common(1)[0][0] if dtypes else None
    result["dtype"] = dtype
    if layers is None and layer_counts:
        layers = layer_counts.most_common(1)[0][0]
    if not layer_sets:
        warnings.append(f"no layer ids in {dl.DATA_CONFIG_FILE} or {dl.LAYERS_FILE}: the "
                        "layer count is only checked to agree across files")
    if hidden is None and widths:
        hidden = widths.most_common(1)[0][0]
    result["layers"], result["hidden_size"] = layers, hidden
    recorded = _recorded_dtype(config)
    if recorded and dtype and recorded != dtype:
        warnings.append(f"{dl.DATA_CONFIG_FILE} says {recorded}, the files hold {dtype} "
                        "(speculators writes bfloat16 there for every model; the files hold "
                        "the model's dtype)")
    missing_lengths = []
    for i, name, reasons, n, nl, dt, width in loaded:
        key: int | str = i if len(by_index[i]) == 1 else name
        for reason in reasons:
            flag(key, reason if key == i else f"{name}: {reason}")
        if nl is not None and layers is not None and nl != layers:
            flag(key, f"{nl} hidden states, {layers} layers captured")
        if dt is not None and dtype is not None and dt != dtype:
            flag(key, f"dtype {dt}, the other files {dtype}")
        if width is not None and hidden is not None and width != hidden:
            flag(key, f"hidden size {width}, expected {hidden}")
        if lengths is not None and n is not None:
            if i not in lengths:
                missing_lengths.append(i)
            elif lengths[i] != n:
                flag(key, f"{n} tokens, {SAMPLE_LENGTHS_FILE} says {lengths[i]}")
    if missing_lengths:
        problems.append(f"{SAMPLE_LENGTHS_FILE} has no entry for {len(missing_lengths)} "
                        f"file(s) (indices {_compress(missing_lengths)}): training then "
                        "estimates every sample's length from file sizes")
    # a duplicate's own reasons are keyed by name: fold them into the index
    for key in [k for k in bad if isinstance(k, str)]:
        i = int(DATA_NAME.match(key).group(1))  # type: ignore[union-attr]
        bad.setdefault(i, []).extend(bad.pop(key))
    result["bad_files"] = [{"index": i, "files": sorted(by_index.get(i, [])) or
                            [f"data_{i}.pt"], "reasons": bad[i]} for i in sorted(bad)]
    bad_ok = not result["bad_files"] and not problems
    result["status"] = "ok" if bad_ok else "bad"
    result["exit"] = OK if bad_ok else BAD
    # a file that is only misnamed is renamed, not regenerated
    regen = sorted(i for i, reasons in bad.items() if any(not r.startswith(RENAME)
                                                          for r in reasons))
    if regen:
        result["regenerate"] = regeneration(directory, regen, config, lengths is not None,
                                            remove=sorted(extra))
    if renames:
        result["rename"] = sorted(renames)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


# --------------------------------------------------------------------------------------
# Regeneration commands
# --------------------------------------------------------------------------------------


def _recorded_args(config: Any) -> list[str] | None:
    command = _get(config, "reproducibility", "command")
    if not isinstance(command, str) or not command.strip():
        return None
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _start_idx(config: Any) -> int:
    args = _recorded_args(config) or []
    for k, a in enumerate(args):
        value = (args[k + 1] if a == "--start-idx" and k + 1 < len(args) else
                 a.partition("=")[2] if a.startswith("--start-idx=") else None)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def _without(args: list[str], options: Sequence[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out


def regeneration(directory: str, indices: Sequence[int], config: Any,
                 has_lengths: bool, remove: Sequence[str] = ()) -> dict[str, Any]:
    """Shell commands that regenerate ``indices``: per contiguous range, delete what is
    there of it (cut-off or wrong files; a whole file would be kept) and run the recorded
    command through ``speculators-compat run --data-parallel 1 --indices A:B`` into the
    same directory, which generates exactly the files of that range that are missing
    (``_data_parallel``: the script's own resume and dataset cut to the range, files
    renamed into place whole, ``sample_lengths.json`` merged); then ``remove`` (the other
    names of duplicated indices) is deleted and the directory checked again.
    ``has_lengths`` is kept for the callers: the launcher merges the lengths itself."""
    del has_lengths
    args = _recorded_args(config)
    start = _start_idx(config)
    note = ("A suggestion: speculators-compat run --data-parallel 1 --indices A:B generates "
            "exactly the missing files of A..B-1 with the recorded command (its dataset "
            "and resume cut to that range), so the bad files are deleted first")
    base = directory.rstrip("/") or directory
    if args:
        script = SCRIPT if os.path.basename(args[0]) == os.path.basename(SCRIPT) else args[0]
        rest = [*_without(args[1:], ("--output-dir",)), "--output-dir", base]
        note += f"; the options are the command {dl.DATA_CONFIG_FILE} records (the last " \
                "run into the directory): check them before running"
        if "--turn-dropout" in rest:
            note += "; --turn-dropout draws turns at random, so regenerated samples differ"
    else:
        script = SCRIPT
        rest = ["--target-model-path", "MODEL", "--train-data-path", "DATA",
                "<the run's other options>", "--output-dir", base]
        note += f"; no command recorded ({dl.DATA_CONFIG_FILE}): fill in the run's options"
    q = shlex.quote
    commands: list[list[str]] = []
    ranges = _ranges(indices)
    for a, b in ranges:
        if a < start:
            commands.append([f"# {a}-{b}: below the recorded --start-idx {start}: written by "
                             "another run; regenerate with that run's options"])
            continue
        files = f"data_{a}.pt" if a == b else f"data_{{{a}..{b}}}.pt"
        commands.append([f"rm -f {q(base)}/{files}",
                         " ".join(["speculators-compat", "run", "--data-parallel", "1",
                                   "--indices", f"{a}:{b + 1}", q(script), *map(q, rest)])])
    after = [f"rm {' '.join(q(os.path.join(base, n)) for n in remove)}"] if remove else []
    after.append(f"speculators-compat check-data {q(base)}")
    return {"note": note, "ranges": [list(r) for r in ranges], "commands": commands,
            "then": after}


# --------------------------------------------------------------------------------------
# --model: sampled re-generation
# --------------------------------------------------------------------------------------


def choose_sample(indices: Sequence[int], k: int) -> list[int]:
    """``k`` of ``indices``, evenly spread (first and last included); all if fewer."""
    if k <= 0:
        raise ValueError(f"--sample must be positive, not {k}")
    indices = sorted(indices)
    if k >= len(indices):
        return indices
    if k == 1:
        return [indices[0]]
    return sorted({indices[round(j * (len(indices) - 1) / (k - 1))] for j in range(k)})


def compare_layers(on_disk: Sequence[Any], regenerated: Sequence[Any],
                   min_cosine: float = 0.99) -> dict[str, Any]:
    """Per layer, the smallest cosine between a token's row on disk and regenerated
    (rows that are zero on both sides count as 1); ``ok`` when every one is at least
    ``min_cosine`` and the shapes agree."""
    import torch

    reasons: list[str] = []
    cosines: list[float | None] = []
    if len(on_disk) != len(regenerated):
        reasons.append(f"{len(regenerated)} regenerated layers, {len(on_disk)} on disk")
    for k, (a, b) in enumerate(zip(on_disk, regenerated)):
        if tuple(a.shape) != tuple(b.shape):
            reasons.append(f"layer {k}: shape {list(b.shape)} regenerated, {list(a.shape)} "
                           "on disk")
            cosines.append(None)
            continue
        a32, b32 = a.float().reshape(a.shape[0], -1), b.float().reshape(b.shape[0], -1)
        cos = torch.nn.functional.cosine_similarity(a32, b32, dim=-1, eps=1e-12)
        both_zero = (a32.abs().amax(-1) == 0) & (b32.abs().amax(-1) == 0)
        cos = torch.where(both_zero, torch.ones_like(cos), cos)
        low = float(cos.min()) if cos.numel() else 1.0
        if math.isnan(low):
            low = -1.0
        cosines.append(round(low, 6))
        if low < min_cosine:
            reasons.append(f"layer {k}: min cosine {low:.4f} < {min_cosine}")
    return {"ok": not reasons, "min_cosine_per_layer": cosines, "reasons": reasons}


def _speculators_generator(**kwargs: Any) -> Any:
    import speculators_compat

    speculators_compat.activate()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    return VllmHiddenStatesGenerator(**kwargs)


def model_check(directory: str, model: str, result: dict[str, Any], sample: int = 4,
                min_cosine: float = 0.99, tensor_parallel_size: int | None = None,
                generator_factory: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Regenerate ``sample`` healthy files of a :func:`check` ``result`` from ``model``
    with speculators' generator (``generator_factory`` replaces it in tests) and compare
    each layer with the file (:func:`compare_layers`)."""
    import torch

    out: dict[str, Any] = {"model": model, "min_cosine": min_cosine, "files": []}
    layer_ids = result.get("layer_ids")
    if not layer_ids:
        out.update(ok=False, error=f"no layer ids in {dl.DATA_CONFIG_FILE} or "
                                   f"{dl.LAYERS_FILE}: which layers to regenerate is unknown")
        return out
    bad = {b["index"] for b in result.get("bad_files", [])}
    healthy = [i for i in range(result.get("expected_files", 0)) if i not in bad]
    if not healthy:
        out.update(ok=False, error="no healthy file to compare")
        return out
    chosen = choose_sample(healthy, sample)
    samples = [torch.load(os.path.join(directory, f"data_{i}.pt"), map_location="cpu",
                          mmap=True, weights_only=True) for i in chosen]
    config, _ = _load_json(os.path.join(directory, dl.DATA_CONFIG_FILE))
    seq = _get(config, "data", "seq_length")
    longest = max(int(s["input_ids"].shape[0]) for s in samples)
    tp = tensor_parallel_size or 1
    kwargs = {"model_path": model, "layer_ids": list(layer_ids),
              "max_model_len": max(seq if isinstance(seq, int) else 0, longest + 1),
              "tensor_parallel_size": tp}
    out["generator"] = dict(kwargs)
    factory = generator_factory or _speculators_generator
    generator = factory(**kwargs)
    try:
        regenerated = generator.generate([s["input_ids"].tolist() for s in samples])
    finally:
        del generator
    ok = True
    for i, s, r in zip(chosen, samples, regenerated):
        disk = s["hidden_states"]
        disk = list(disk.unbind(0)) if isinstance(disk, torch.Tensor) else list(disk)
        verdict = compare_layers(disk, list(r["hidden_states"]), min_cosine)
        if not torch.equal(torch.as_tensor(r["input_ids"]).cpu(), s["input_ids"].cpu()):
            verdict["ok"] = False
            verdict["reasons"].append("the generator returned other input_ids")
        ok = ok and verdict["ok"]
        out["files"].append({"index": i, **verdict})
    out["ok"] = ok
    return out


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------


def lines(result: dict[str, Any], show: int = SHOW) -> list[str]:
    """What the command prints without ``--json``."""
    if result["exit"] == ERROR:
        return [f"check-data: {result['message']}"]
    bad = result["bad_files"]
    out = [f"check-data {result['dir']}: {result['files_checked']} files checked, "
           f"{len(bad)} bad, {len(result['problems'])} directory problem(s), "
           f"{result['seconds']:.1f} s ({result['jobs']} jobs)"]
    facts = [f"{result.get('expected_files')} indices"]
    if result.get("layers"):
        facts.append(f"{result['layers']} layers" + (
            f" {result['layer_ids']} ({', '.join(result['layer_ids_from'])})"
            if result.get("layer_ids") else ""))
    if result.get("hidden_size"):
        facts.append(f"hidden size {result['hidden_size']}")
    if result.get("dtype"):
        facts.append(result["dtype"])
    out.append("expected: " + ", ".join(facts))
    out += [f"warning: {w}" for w in result["warnings"]]
    out += [f"problem: {p}" for p in result["problems"]]
    if bad:
        out.append(f"bad files ({len(bad)}):")
        for b in bad[:show]:
            out.append(f"  {'/'.join(b['files'])}: {'; '.join(b['reasons'])}")
        if len(bad) > show:
            out.append(f"  ... and {len(bad) - show} more (--json lists all)")
    regen = result.get("regenerate")
    if regen:
        out.append("to regenerate them:")
        out += textwrap.wrap(regen["note"], 86, initial_indent="  # ",
                             subsequent_indent="  # ", break_on_hyphens=False)
        for cmd in regen["commands"][:show]:
            out += [f"  {line}" for line in cmd]
        if len(regen["commands"]) > show:
            out.append(f"  ... {len(regen['commands']) - show} more ranges (--json lists all)")
        out += [f"  {line}" for line in regen["then"]]
    if result.get("rename"):
        out.append("to rename them:")
        out += [f"  {line}" for line in result["rename"]]
    mc = result.get("model_check")
    if mc:
        if "error" in mc:
            out.append(f"--model: {mc['error']}")
        for f in mc["files"]:
            out.append(f"--model data_{f['index']}.pt: min cosine per layer "
                       f"{f['min_cosine_per_layer']} -> {'ok' if f['ok'] else 'FAIL'}"
                       + (f" ({'; '.join(f['reasons'])})" if f["reasons"] else ""))
    out.append("OK" if result["exit"] == OK else "FAIL")
    return out
