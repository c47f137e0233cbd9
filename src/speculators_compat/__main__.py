"""Command line: ``speculators-compat doctor | run | demo | check-draft | check-data``
(also ``python -m speculators_compat``).

* ``doctor [--json]``: versions, whether the support matrix proved this vLLM release
  (and at which level; else the newest proven one), plugin registration, and each
  adapter's verdict and reason. It probes in its own short-lived process and reverts
  everything before it exits: nothing in any other process changes.
* ``run SCRIPT [ARGS...]`` / ``run -m MODULE [ARGS...]``: activate, then run the user's
  script unchanged as ``__main__`` with its own argv (like ``ddtrace-run``), so an
  existing data-generation command works by prefixing it. Every Python process it
  starts (vLLM's workers included) activates at interpreter start (``_bootstrap``).
  ``data_<i>.pt`` files are saved whole (``_offline_hooks``).
* ``run --data-parallel N [--gpus-per-replica K] [--replicas-per-gpu M] SCRIPT [ARGS...]``:
  N replicas of speculators' offline script on disjoint sample ranges and devices (or M
  replicas per GPU, each with 1/M of its memory), one output folder;
  multi-node under torchrun / SLURM / Open MPI; a rerun generates only what is missing
  (``_data_parallel``).
* ``demo``: build a tiny checkpoint, run speculators' own generator through the shim on
  the installed vLLM, compare every layer with transformers, print the report,
  PASS/FAIL and tokens/s.
* ``check-draft DRAFT_DIR [--data DIR] [--target MODEL_DIR|N] [--json]``: which target
  layers vLLM will feed a saved EAGLE-3 draft, and whether they are the ones its training
  data holds (exit 1 when not, or when that cannot be confirmed).
* ``check-data DIR [--model DIR [--sample K]] [--jobs N] [--json]``: every ``data_<i>.pt``
  of speculators 0.3/0.4's offline script loads, is there exactly once and agrees with the
  directory's metadata (exit 1 otherwise, with commands that regenerate the bad indices);
  ``--model`` regenerates K of them and compares the layers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import runpy
import sys
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from . import _env, _matrix_proof, _versions

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "speculators_compat"


def plugin_status() -> dict:
    """Whether our ``vllm.general_plugins`` entry point is registered and will be loaded."""
    eps = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else [n.strip() for n in allowed.split(",") if n.strip()]
    loads = bool(eps) and (names is None or PLUGIN_NAME in names)
    if not eps:
        note = ("entry point not registered: install the package (pip install "
                "speculators-compat) so vLLM's workers can re-activate it")
    elif not loads:
        note = (f"VLLM_PLUGINS={allowed!r} excludes {PLUGIN_NAME!r}: worker-side adapters will "
                "not run in vLLM's workers (capture still works: it is named by the driver)")
    else:
        note = "registered; vLLM loads it in every worker, and it acts only when activated"
    return {"registered": bool(eps), "value": eps[0].value if eps else None,
            "vllm_plugins": allowed, "loads_in_workers": loads, "note": note}


def bootstrap_status() -> dict:
    """Where the interpreter-start hook is, and whether this process's PYTHONPATH has it."""
    from . import _bootstrap

    ships = os.path.isfile(os.path.join(_bootstrap.DIRECTORY, "sitecustomize.py"))
    return {"directory": _bootstrap.DIRECTORY, "ships": ships,
            "on_pythonpath": _bootstrap.on_pythonpath(),
            "note": ("activate() puts it on PYTHONPATH: child Pythons activate at start"
                     if ships else "sitecustomize.py is missing from the installed package: "
                     "spawned workers activate only through the plugin (reinstall)")}


def _model_family(model: str, versions: dict[str, Any]) -> dict[str, Any]:
    """The architecture matrix's verdict for a checkpoint (its config.json, read as JSON:
    nothing is loaded)."""
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        return {"error": str(exc), "text": f"cannot read {model}/config.json: {exc}"}
    archs = list(cfg.get("architectures") or [])
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    archs += [a for a in text_cfg.get("architectures") or [] if a not in archs]
    verdict = _matrix_proof.family_verdict(archs, versions.get("vllm"), versions.get("speculators"))
    from ._model_support import refusal_of_config_file

    why = refusal_of_config_file(cfg)
    if why:
        verdict.update(proven=False, level=None, refused=True, text=why)
    return verdict


def cmd_doctor(args: argparse.Namespace) -> int:
    from ._errors import UnsupportedError
    from ._process import ACTIVATION
    from ._report import Status

    previously_active = ACTIVATION.active
    os.environ.pop(_env.REPORT_FILE, None)  # a dry run is no provenance
    logging.getLogger("speculators_compat").setLevel(logging.ERROR)
    try:
        report = ACTIVATION.activate(strict=False)
    except UnsupportedError as exc:
        versions = _versions.snapshot()
        proven = _matrix_proof.verdict(versions["vllm"], versions["speculators"])
        if args.json:
            print(json.dumps({"supported": False, "error": str(exc), "versions": versions,
                              "proven": proven, "plugin": plugin_status()}, indent=2))
        else:
            print(f"unsupported: {exc}")
            print(f"support matrix: {proven['text']}")
        return 2
    data = report.as_dict()
    if not previously_active:
        ACTIVATION.deactivate()
    data["active"] = False
    data["dry_run"] = True
    data["vllm_distribution"] = _versions.installed_distribution("vllm")
    if getattr(args, "model", None):
        data["model_family"] = _model_family(args.model, data["versions"])
    data["plugin"] = plugin_status()
    data["bootstrap"] = bootstrap_status()
    data["environment"] = {k: os.environ.get(k) for k in
                           (_env.DISABLE, _env.STRICT, _env.VLLM_VERSION, "VLLM_PLUGINS",
                            "VLLM_USE_V2_MODEL_RUNNER", "VLLM_WORKER_MULTIPROC_METHOD")}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    v = data["versions"]
    print(f"speculators-compat {v['speculators_compat']}")
    for name in ("vllm", "speculators", "torch", "transformers"):
        extra = f" ({data['vllm_distribution']})" if name == "vllm" and v[name] else ""
        print(f"  {name:<13} {v[name] or 'not installed'}{extra}")
    print(f"support matrix: {data['proven']['text']}")
    if "model_family" in data:
        print(f"model family: {data['model_family']['text']}")
    print(f"plugin: {data['plugin']['note']}")
    print(f"bootstrap: {data['bootstrap']['note']} ({data['bootstrap']['directory']})")
    print("adapters (verdicts from a dry run in this process; nothing else changed):")
    for line in report.table({Status.APPLIED: "applies"}):
        print(line)
    if report.problems:
        print(f"{len(report.problems)} adapter(s) cannot help with this installation; see "
              "docs/troubleshooting.md")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Activate, then run the target as ``__main__`` the way ``python`` would.

    ``activate()`` also puts the interpreter-start hook (``_bootstrap``) on
    ``PYTHONPATH``: vLLM's spawned workers, which re-run this script before any vLLM
    code, activate before the script's module-level imports run there. runpy makes the
    target ``sys.modules["__main__"]`` while it runs, so ``multiprocessing`` re-runs the
    target (not this CLI) in spawned children.
    """
    import speculators_compat

    strays = [flag for flag, value in (("--gpus-per-replica", args.gpus_per_replica != 1),
                                       ("--replicas-per-gpu", args.replicas_per_gpu != 1),
                                       ("--indices", args.indices),
                                       ("--rank", args.rank is not None),
                                       ("--world-size", args.world_size)) if value]
    if args.data_parallel is None and strays:
        print(f"speculators-compat run: {', '.join(strays)} only with --data-parallel N",
              file=sys.stderr)
        return 2
    if not args.module and not os.path.isfile(args.target):
        print(f"speculators-compat run: {args.target}: no such file (use -m for a module)",
              file=sys.stderr)
        return 2
    if args.data_parallel is not None:
        if args.module:
            print("speculators-compat run --data-parallel runs a script (speculators' "
                  "scripts/data_generation_offline.py), not a module (-m)", file=sys.stderr)
            return 2
        from . import _data_parallel

        return _data_parallel.main(args.target, args.args, args.data_parallel,
                                   args.gpus_per_replica, args.indices, args.rank,
                                   args.world_size, replicas_per_gpu=args.replicas_per_gpu)
    report = speculators_compat.activate()
    print(report.summary_line(), file=sys.stderr)
    for r in report.problems:
        print(f"speculators-compat: {r.name} {r.status.value}: {r.reason}", file=sys.stderr)
    from . import _data_parallel, _offline_hooks

    _offline_hooks.install()  # whole data_<i>.pt files; a replica's range
    gaps = None if args.module else _data_parallel.plain_run_gaps(args.args)
    if gaps:
        print(f"speculators-compat: warning: {gaps}", file=sys.stderr)
    sys.argv = [args.target, *args.args]
    if args.module:
        sys.path.insert(0, os.getcwd())  # as `python -m` does
        runpy.run_module(args.target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.target)))
        runpy.run_path(args.target, run_name="__main__")
    return 0


def default_workdir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "speculators-compat")


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from .demo.checkpoints import build_checkpoint
        from .demo.runner import DEFAULT_LAYERS, make_sequences, run_check
    except ImportError as exc:
        print(f"demo: step 'import torch/transformers' failed: {exc}. The demo needs torch, "
              "transformers, vLLM and speculators 0.3/0.4 installed.", file=sys.stderr)
        return 1
    tf = _versions.installed("transformers")
    path = os.path.join(args.workdir, f"tf-{tf}", args.model)
    print(f"[0] build tiny {args.model} checkpoint in {path}")
    try:
        build_checkpoint(args.model, path)
    except Exception as exc:  # noqa: BLE001
        print(f"demo: step 'build checkpoint' failed: {type(exc).__name__}: {exc}")
        return 1
    sizes = [int(s) for s in args.batches.split(",")]
    batches = [make_sequences(n, seed=i) for i, n in enumerate(sizes)]
    layers = [int(x) for x in args.layers.split(",")] if args.layers else DEFAULT_LAYERS[args.model]
    result = run_check(path, layer_ids=layers, batches=batches,
                       activate=not args.no_activate)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    for i, b in enumerate(result["batches"]):
        c = b.get("compare", {})
        tps = b.get("tokens_per_s")
        print(f"batch {i}: {b['size']} sequences, {b['tokens']} tokens, "
              f"{'%.0f' % tps if tps else '?'} tokens/s, input order "
              f"{'kept' if b.get('input_order') else 'BROKEN'}, dtype {b.get('dtypes')}, "
              f"min cosine {c.get('min_cosine')}, max abs err/ref max {c.get('max_rel_abs_err')}"
              f" -> {'ok' if b.get('ok') else 'FAIL'}")
    if result["ok"]:
        print(f"PASS: hidden states of layers {result.get('layer_ids')} equal transformers' "
              "decoder-layer outputs for every sequence")
        return 0
    if "failed_step" in result:
        print(f"FAIL at step '{result['failed_step']}': {result['error']}")
    else:
        print("FAIL: " + "; ".join(r for b in result["batches"]
                                   for r in b.get("compare", {}).get("reasons", [])[:5]))
    return 1


def cmd_check_draft(args: argparse.Namespace) -> int:
    from ._check_draft import check, lines

    result = check(args.draft, args.data, args.target)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(lines(result)))
    return int(result["exit"])


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With ``--json``, what vLLM and its worker processes print (they log to stdout, and
    spawned workers inherit the descriptor) goes to stderr, so stdout holds the JSON alone."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_check_data(args: argparse.Namespace) -> int:
    from ._check_data import BAD, ERROR, check, lines, model_check

    result = check(args.dir, args.jobs)
    if args.model and result["exit"] != ERROR:
        with _stdout_to_stderr(args.json):
            mc = model_check(args.dir, args.model, result, sample=args.sample,
                             min_cosine=args.min_cosine,
                             tensor_parallel_size=args.tensor_parallel_size)
        result["model_check"] = mc
        if not mc["ok"]:
            result["status"], result["exit"] = "bad", BAD
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(lines(result)))
    return int(result["exit"])


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speculators-compat", description=__doc__.split(
        "\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="versions, plugin and adapter verdicts (changes nothing)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--model", metavar="DIR",
                   help="also say whether this checkpoint's architecture was proven here "
                        "(docs/architectures.md)")
    d.set_defaults(func=cmd_doctor)
    r = sub.add_parser("run", help="activate, then run SCRIPT (or -m MODULE) as __main__")
    r.add_argument("-m", dest="module", action="store_true", help="run a module, like python -m")
    r.add_argument("--data-parallel", type=_positive, default=None, metavar="N",
                   help="N replicas of speculators' offline script on disjoint sample ranges "
                        "and devices, into one --output-dir; a rerun generates only the "
                        "missing samples (also with N=1)")
    r.add_argument("--gpus-per-replica", type=_positive, default=1, metavar="K",
                   help="GPUs of each replica (its --tensor-parallel-size; default 1)")
    r.add_argument("--replicas-per-gpu", type=_positive, default=1, metavar="M",
                   help="with --data-parallel: M replicas share each GPU (or group of K), "
                        "N/M GPUs in all; each gets the script's --gpu-memory-utilization "
                        "(default 0.8) / M unless given, and starts once the one before it "
                        "on the GPU has its memory (default 1: disjoint GPUs)")
    r.add_argument("--indices", default=None, metavar="A:B",
                   help="with --data-parallel: only the files data_A..data_<B-1>")
    r.add_argument("--rank", type=int, default=None,
                   help="with --data-parallel: this task's rank among --world-size tasks "
                        "(default: RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK)")
    r.add_argument("--world-size", type=_positive, default=None,
                   help="with --data-parallel: the number of tasks (default: WORLD_SIZE, "
                        "SLURM_NTASKS or OMPI_COMM_WORLD_SIZE; else 1)")
    r.add_argument("target")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("demo", help="tiny end-to-end extraction checked against transformers")
    m.add_argument("--model", default="llama", choices=["llama", "deepseek_v3", "qwen3",
                                                        "qwen3_moe"])
    m.add_argument("--batches", default="12", help="comma-separated batch sizes (default 12)")
    m.add_argument("--layers", default=None, help="comma-separated layer ids")
    m.add_argument("--workdir", default=default_workdir())
    m.add_argument("--no-activate", action="store_true",
                   help="run without the shim (shows what fails upstream)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_demo)
    c = sub.add_parser("check-draft", help="which target layers vLLM feeds a saved EAGLE-3 draft, "
                                           "and whether they match its training data")
    c.add_argument("draft", help="the draft's folder (config.json)")
    c.add_argument("--data", default=None, help="the folder of the data it was trained on")
    c.add_argument("--target", default=None,
                   help="the target model's folder, or its decoder layer count (default: "
                        "the verifier named in the draft's config)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check_draft)
    k = sub.add_parser("check-data", help="verify an output directory of speculators' "
                                          "offline data generation before training")
    k.add_argument("dir", help="the folder of data_<i>.pt files")
    k.add_argument("--jobs", type=_positive, default=None,
                   help="processes that load files (default: the CPU count)")
    k.add_argument("--model", default=None,
                   help="also regenerate --sample files from this model with speculators' "
                        "generator (needs vLLM) and compare every layer")
    k.add_argument("--sample", type=_positive, default=4,
                   help="files --model regenerates (default 4)")
    k.add_argument("--min-cosine", type=float, default=0.99,
                   help="per-token cosine --model requires in every layer (default 0.99)")
    k.add_argument("--tensor-parallel-size", type=_positive, default=None,
                   help="for --model (default 1)")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_check_data)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
